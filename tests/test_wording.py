"""Code and docs say what is, not when it came: no numbered tracker items ("issue" and a number) and no "this"
followed by "round", which dates as soon as the next round lands. The repository has no tracker to follow such a
number to; what changed when is told once, in docs/history.md, the one file exempt."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATED = re.compile(r"\bissues?\s+#?\d+|\bthis\s+round\b", re.I)
SUFFIXES = {".py", ".md", ".sh", ".yaml", ".toml", ".def", ".sbatch", ".jinja", ".cfg"}
EXEMPT = {ROOT / "docs" / "history.md"}


def _files() -> list[Path]:
    top = [ROOT / "README.md", ROOT / "pyproject.toml", ROOT / "install.sh"]
    trees = [p for d in ("agentrl", "jobs", "tests", "sbatch", "containers", "docs", "data", ".ci")
             for p in (ROOT / d).rglob("*") if p.suffix in SUFFIXES and p.is_file()]
    return [p for p in [*top, *trees] if p.exists() and p not in EXEMPT and "__pycache__" not in p.parts]


def test_no_dated_words() -> None:
    found = [f"{p.relative_to(ROOT)}:{n}: {m.group(0)}" for p in _files()
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) for m in DATED.finditer(line)]
    assert found == [], f"{len(found)} dated references (history belongs in docs/history.md):\n" + "\n".join(found)


OLD_NAMES = re.compile(r"\bgateway|\bupstream", re.I)
"""The controller was also 'the gateway' and the env worker 'the upstream': one name per thing now
(docs/architecture.md §11, the glossary, which alone names the old words)."""
GLOSSARY = ROOT / "docs" / "architecture.md"


def _outside_glossary(p: Path) -> list[tuple[int, str]]:
    lines = list(enumerate(p.read_text(errors="replace").splitlines(), 1))
    if p == GLOSSARY:
        start = next(n for n, line in lines if line.startswith("## 11. Glossary"))
        nxt = [n for n, line in lines if n > start and line.startswith("## ")]
        lines = [(n, line) for n, line in lines if not start <= n < (nxt[0] if nxt else len(lines) + 1)]
    return lines


def test_one_name_per_thing() -> None:
    here = Path(__file__).resolve()
    found = [f"{p.relative_to(ROOT)}:{n}: {m.group(0)}" for p in _files() if p != here
             for n, line in _outside_glossary(p) for m in OLD_NAMES.finditer(line)]
    assert found == [], f"{len(found)} old names (the controller, the env worker: see the glossary):\n" + "\n".join(found)
