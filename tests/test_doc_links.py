"""Every relative link and every `file.py::name` in the README and docs/ resolves: the file exists and, for
`file.md#anchor`, a heading of that file makes the anchor (GitHub's rule: lower case, punctuation dropped, spaces
to hyphens); for `file.py::name`, the file defines the name."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _anchor(heading: str) -> str:
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    body = FENCE.sub("", page.read_text())
    return {_anchor(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", body, re.M)}


def _links(page: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(FENCE.sub("", page.read_text()))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    bad = []
    for target in _links(page):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: no heading makes #{anchor}")
    assert bad == [], bad


CODE_REF = re.compile(r"`([\w./-]+\.py)::([A-Za-z_][\w.]*)(?:\(\))?`(?:\]\(([^)#\s]+\.py)\))?")
"""`file.py::name` in a code span, and the `.py` it links to when it is a link text ("[`file.py::name`](path.py)")."""
SOURCE_DIRS = ("agentrl", "jobs", "tests", "data")


def _defines(path: Path, name: str) -> bool:
    """`path` defines `name`'s last part: a function, a class or a module-level (or class-level) name."""
    last = name.split(".")[-1]
    return bool(re.search(rf"^\s*(async\s+def|def|class)\s+{last}\b|^\s*{last}\s*[:=]", path.read_text(), re.M))


def _candidates(page: Path, file: str, link: str) -> list[Path]:
    """The files a reference may mean: its link's target; else `file` from the root, from agentrl/, or (a bare
    `role.py`) any source file whose path ends so."""
    if link:
        return [(page.parent / link).resolve()]
    exact = [p for p in (ROOT / file, ROOT / "agentrl" / file) if p.is_file()]
    if exact:
        return exact
    return [p for d in SOURCE_DIRS for p in (ROOT / d).rglob(Path(file).name) if str(p).endswith("/" + file)]


def _code_refs(page: Path) -> list[tuple[str, str, str]]:
    return CODE_REF.findall(FENCE.sub("", page.read_text()))


def test_the_readme_links_the_loop() -> None:
    assert len([r for r in _code_refs(ROOT / "README.md") if r[2]]) > 20  # the loop's steps are linked


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_code_references_name_what_the_file_defines(page: Path) -> None:
    """Each `file.py::name` of a page (the README's loop and code map, the docs' pointers), linked or not, names a
    function, class or module-level name that the file defines, not one it imports: a rename or a move that
    forgets the docs fails here, not in a newcomer's first hour."""
    bad = []
    for file, name, link in _code_refs(page):
        files = _candidates(page, file, link)
        if not files:
            bad.append(f"{file}::{name}: no such file")
        elif not any(_defines(p, name) for p in files):
            bad.append(f"{file}::{name}: {', '.join(str(p.relative_to(ROOT)) for p in files)} does not define it")
    assert bad == [], bad


def test_the_readme_stays_short_with_two_set_up_commands() -> None:
    """The README is a page, not a second benchmarks file: at most 250 lines, and a fresh machine needs exactly
    two commands from it (install and the demo; the tests)."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert text.count("```bash") == 2
