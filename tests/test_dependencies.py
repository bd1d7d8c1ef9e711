"""The dependency directions of design §2, checked over the package's imports (AST, no execution).

Roles meet only at wire formats: rollout never imports trainer or controller, trainer never imports
rollout/envs/controller, algorithms stay pure math, launch runs on a login node without torch or vLLM,
and nothing imports the `jobs/` entry points: not the package, not another entry point (code two
jobs share belongs in `agentrl/`), and not a test (tests call the library; a test of a command line runs
it, `python -m jobs.x`, in a subprocess). `agentrl/auth.py` (the run's secret) is standard library only, so
every role, the launcher included, may use it.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "agentrl"
JOBS = ROOT / "jobs"

# module (subpackage or top-level file) -> agentrl modules it may import; "*" = anything third-party
ALLOWED: dict[str, set[str]] = {
    "types": set(),
    "config": set(),
    "auth": set(),
    "fsio": set(),
    "algorithms": {"types"},
    "envs": {"types", "config", "auth", "fsio"},
    "transport": {"types", "config", "fsio"},
    "monitor": {"types", "config", "fsio"},
    # the tiny policy's tokenizer is trained on the tasks' expert episodes (models.tiny_policy); no role imports models
    "models": {"envs", "types", "config", "fsio"},
    "controller": {"envs", "types", "config", "auth", "fsio"},
    "rollout": {"envs", "transport", "monitor", "types", "config", "auth", "fsio"},
    "trainer": {"algorithms", "transport", "monitor", "types", "config", "fsio"},
    "launch": {"config", "auth", "fsio"},
    # evaluation plays episodes as the rollout does (engines, the model's format, the gateway) and starts env
    # services the way the local launcher does; it never imports the trainer
    "evaluation": {"rollout", "envs", "monitor", "launch", "transport", "types", "config", "auth", "fsio"},
    # what the jobs/bench_*.py entry points measure
    "bench": {"trainer", "types", "config", "fsio"},
}
# third-party modules a subpackage must never import
FORBIDDEN_THIRD_PARTY: dict[str, set[str]] = {
    "algorithms": {"torch.distributed", "mpi4py", "vllm", "h5py", "aiohttp"},
    "launch": {"torch", "vllm", "mpi4py", "transformers", "h5py"},
    "types": {"torch", "vllm"},
    "config": {"torch", "vllm"},
    "envs": {"torch", "vllm"},
    "controller": {"torch", "vllm", "transformers"},
}
STDLIB_ONLY = {"auth", "fsio"}
"""Modules that import nothing outside the standard library (the launcher's login node has little)."""


def _owner(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0].removesuffix(".py")


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            raise AssertionError(f"{path}: use absolute imports (agentrl.x), not relative ones")
    return out


FILES = sorted(p for p in PKG.rglob("*.py"))


def test_every_module_has_a_rule() -> None:
    owners = {_owner(p) for p in FILES if p.name != "__init__.py" or p.parent != PKG}
    assert owners <= set(ALLOWED), f"no dependency rule for {owners - set(ALLOWED)}"


def _violations(owner: str, modules: list[str]) -> list[str]:
    """The imports among `modules` that a module of `owner` may not make."""
    bad = []
    for mod in modules:
        parts = mod.split(".")
        if parts[0] == "jobs":
            bad.append(f"imports the entry points ({mod})")
        elif parts[0] == "agentrl":
            target = parts[1] if len(parts) > 1 else ""
            if not target:
                bad.append("imports the package root; import a module")
            elif target != owner and target not in ALLOWED[owner]:
                bad.append(f"{owner} must not import agentrl.{target} ({mod})")
        bad += [f"{owner} imports {mod}" for b in FORBIDDEN_THIRD_PARTY.get(owner, ())
                if mod == b or mod.startswith(b + ".")]
        if owner in STDLIB_ONLY and parts[0] not in sys.stdlib_module_names and parts[0] != "__future__":
            bad.append(f"{owner} must use the standard library only ({mod})")
    return bad


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PKG)))
def test_dependency_directions(path: Path) -> None:
    if path == PKG / "__init__.py":
        return
    assert _violations(_owner(path), _imports(path)) == [], path.relative_to(PKG)


JOB_FILES = sorted(JOBS.glob("*.py"))


@pytest.mark.parametrize("path", JOB_FILES, ids=lambda p: p.name)
def test_jobs_never_import_jobs(path: Path) -> None:
    """An entry point imports the package, never another entry point."""
    assert [m for m in _imports(path) if m.split(".")[0] == "jobs"] == [], path.name


TESTS = ROOT / "tests"
TESTS_IMPORTING_JOBS = {
    # jobs/agentbench_check.py's library moves into agentrl/ (issue 20's branch); each entry must still import jobs
    # (a stale one fails below)
    "envs/test_agentbench_check.py",  # jobs.agentbench_check
    "envs/test_agentbench_db.py",  # jobs.agentbench_check
    "envs/test_db_mariadb.py",  # jobs.agentbench_check
}
TEST_FILES = sorted(TESTS.rglob("*.py"))


def _jobs_imports(path: Path) -> list[str]:
    return [m for m in _imports(path) if m.split(".")[0] == "jobs"]


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: str(p.relative_to(TESTS)))
def test_tests_never_import_jobs(path: Path) -> None:
    """A test imports the library; it runs an entry point only as a command (`python -m jobs.x` in a subprocess)."""
    rel = str(path.relative_to(TESTS))
    if rel in TESTS_IMPORTING_JOBS:
        assert _jobs_imports(path), f"{rel} no longer imports jobs: remove it from TESTS_IMPORTING_JOBS"
    else:
        assert _jobs_imports(path) == [], rel


def test_the_checker_catches_violations(tmp_path: Path) -> None:
    """The rule table is live: each forbidden direction of design §2 is reported."""
    bad = tmp_path / "x.py"
    bad.write_text("from agentrl.trainer.step import rl_step\nimport torch.distributed\nimport jobs.train\n")
    mods = _imports(bad)
    assert len(_violations("rollout", mods)) == 2  # trainer, jobs
    assert len(_violations("algorithms", mods)) == 3  # trainer, torch.distributed, jobs
    assert _violations("rollout", ["agentrl.controller.server"]) != []
    assert _violations("launch", ["torch"]) != [] and _violations("launch", ["agentrl.config"]) == []
    assert _violations("trainer", ["agentrl.algorithms.ppo", "torch"]) == []
    assert _violations("auth", ["aiohttp"]) != [] and _violations("auth", ["hmac", "os.path"]) == []
    assert _violations("launch", ["agentrl.auth"]) == [] and _violations("trainer", ["agentrl.auth"]) != []
    job = tmp_path / "job.py"
    job.write_text("from jobs.controller import serve\nimport agentrl.config\n")
    assert [m for m in _imports(job) if m.split(".")[0] == "jobs"] == ["jobs.controller"]
