"""The dependency directions of design §2, checked over the package's imports (AST, no execution).

Roles meet only at wire formats: rollout never imports trainer or controller, trainer never imports
rollout/envs/controller, algorithms stay pure math, launch runs on a login node without torch or vLLM,
and nothing in the package imports the `jobs/` entry points.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "agentrl"

# module (subpackage or top-level file) -> agentrl modules it may import; "*" = anything third-party
ALLOWED: dict[str, set[str]] = {
    "types": set(),
    "config": set(),
    "algorithms": {"types"},
    "envs": {"types", "config"},
    "transport": {"types", "config"},
    "monitor": {"types", "config"},
    "models": {"types", "config"},
    "controller": {"envs", "types", "config"},
    "rollout": {"envs", "transport", "monitor", "types", "config"},
    "trainer": {"algorithms", "transport", "monitor", "types", "config"},
    "launch": {"config"},
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


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PKG)))
def test_dependency_directions(path: Path) -> None:
    if path == PKG / "__init__.py":
        return
    owner = _owner(path)
    for mod in _imports(path):
        parts = mod.split(".")
        assert parts[0] != "jobs", f"{path}: imports the entry points ({mod})"
        if parts[0] == "agentrl":
            if len(parts) == 1:
                raise AssertionError(f"{path}: import a module, not the package root")
            target = parts[1]
            assert target == owner or target in ALLOWED[owner], \
                f"{path.relative_to(PKG)}: {owner} must not import agentrl.{target} ({mod})"
        for bad in FORBIDDEN_THIRD_PARTY.get(owner, ()):
            assert mod != bad and not mod.startswith(bad + "."), f"{path.relative_to(PKG)}: {owner} imports {mod}"


def test_the_checker_catches_a_violation(tmp_path: Path) -> None:
    """The rule table is live: a rollout module importing the trainer is reported."""
    bad = tmp_path / "x.py"
    bad.write_text("from agentrl.trainer.step import rl_step\n")
    mods = _imports(bad)
    assert "agentrl.trainer.step" in mods and "trainer" not in ALLOWED["rollout"]
