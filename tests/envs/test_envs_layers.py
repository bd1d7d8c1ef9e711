"""envs/ by layer (the `agentrl.envs` package docstring), checked over the imports (AST, no execution):

  * the task author's API (`task`) needs nothing of ours but `agentrl.types`, and the gateway's JSON types
    (`wire_types`) nothing but that API: a task author, the controller and the client read them alone;
  * the os runtime (`sandbox/`) serves the os task (its options: `tasks/options.py`) and the checks that attack
    it, nothing else;
  * the checks (`checks/`) are run from `jobs/`; in the package only the rollout's hostile-text check uses
    one of their types.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENVS = ROOT / "agentrl" / "envs"


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


@pytest.mark.parametrize("name, allowed", [("task.py", {"agentrl.types"}),
                                           ("wire_types.py", {"agentrl.types", "agentrl.envs.task"})])
def test_the_api_modules_stand_alone(name: str, allowed: set[str]) -> None:
    extra = {m for m in agentrl_imports(ENVS / name) if not any(within(m, a) for a in allowed)}
    assert extra == set(), f"{name} imports {extra}"


def test_the_sandbox_serves_the_os_task_and_the_checks() -> None:
    users = {rel(p) for p in code_files() if p.parent != ENVS / "sandbox"
             and any(within(m, "agentrl.envs.sandbox") for m in agentrl_imports(p))}
    outside = {u for u in users if not (u.startswith(("agentrl/envs/tasks/os_task/", "agentrl/envs/checks/",
                                                      "jobs/", "tests/")) or u == "agentrl/envs/tasks/options.py")}
    assert outside == set(), f"the os runtime is imported by {sorted(outside)}"


def test_the_checks_are_run_from_jobs() -> None:
    users = {rel(p) for p in (ROOT / "agentrl").rglob("*.py") if ENVS / "checks" not in p.parents
             and any(within(m, "agentrl.envs.checks") for m in agentrl_imports(p))}
    assert users <= {"agentrl/rollout/hostile.py"}, f"package modules that import the checks: {sorted(users)}"
