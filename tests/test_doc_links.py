"""Every relative link in the README and docs/ resolves: the file exists and, for `file.md#anchor`, a heading of
that file makes the anchor (GitHub's rule: lower case, punctuation dropped, spaces to hyphens)."""
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


CODE_LINK = re.compile(r"\[`([^`]+)::([A-Za-z_][\w.]*)(?:\(\))?`\]\(([^)#\s]+\.py)\)")


def test_the_loops_function_links_name_what_the_file_defines() -> None:
    """Each "[`file::name`](path.py)" of the README (the loop, the code map) names a function, class or module-level
    name the linked file defines: a rename that forgets the README fails here, not in a newcomer's first hour."""
    text = (ROOT / "README.md").read_text()
    links = CODE_LINK.findall(text)
    assert len(links) > 20, links  # the loop's steps are linked
    bad = []
    for _, name, path in links:
        src = (ROOT / path).read_text()
        last = name.split(".")[-1]
        if not re.search(rf"^\s*(async\s+def|def|class)\s+{last}\b|^\s*{last}\s*[:=]", src, re.M):
            bad.append(f"{path}::{name}")
    assert bad == [], bad
