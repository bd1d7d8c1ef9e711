"""Who uses the os runtime, checked over the imports (AST, no execution): `agentrl.sandbox` serves the os task
(and its options, `tasks/options.py`) and the checks that attack it, nothing else. The package-wide rules (the
task author's API standing alone, nothing importing the checks) are tests/test_dependencies.py's.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SANDBOX = ROOT / "agentrl" / "sandbox"


def agentrl_imports(path: Path) -> set[str]:
    """The agentrl modules `path` imports anywhere, functions included (`from p import m` counts as `p.m`)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m.split(".")[0] == "agentrl"}


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def code_files() -> list[Path]:
    return sorted(p for d in ("agentrl", "jobs", "tests") for p in (ROOT / d).rglob("*.py"))


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_sandbox_serves_the_os_task_and_the_checks() -> None:
    users = {rel(p) for p in code_files() if SANDBOX not in p.parents
             and any(within(m, "agentrl.sandbox") for m in agentrl_imports(p))}
    outside = {u for u in users if not (u.startswith(("agentrl/tasks/os_task/", "agentrl/checks/",
                                                      "jobs/", "tests/")) or u == "agentrl/tasks/options.py")}
    assert outside == set(), f"the os runtime is imported by {sorted(outside)}"
