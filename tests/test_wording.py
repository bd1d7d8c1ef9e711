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
