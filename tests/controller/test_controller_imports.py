"""The controller imports only what the design allows (docs/architecture.md §2): it shares the serving layer's
plumbing (the JSON types, the HTTP pieces both servers share, the listener), never a task or a session."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "agentrl"
ALLOWED = {
    # the controller meets the env workers at the wire: their JSON types, the HTTP pieces both servers share, the
    # listener
    "serving/controller": {"agentrl.types", "agentrl.config", "agentrl.auth", "agentrl.serving.wire_types",
                           "agentrl.serving.client", "agentrl.serving.wire", "agentrl.serving.listener",
                           "agentrl.serving.controller"},
}


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports(package: str) -> None:
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in imported_modules(path):
            assert not name.startswith("jobs"), f"{path} imports {name}"
            if name.startswith("agentrl"):
                assert any(name == a or name.startswith(a + ".") for a in ALLOWED[package]), f"{path} imports {name}"
