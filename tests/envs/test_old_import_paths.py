"""Every module path users and task authors imported before envs/ was split by layer still imports, and
gives the same objects as the module that now holds them (a re-export, never a copy)."""
from __future__ import annotations

import importlib

import pytest

MOVED: dict[str, list[str]] = {
    # old module path -> the modules its names now live in
    "agentrl.envs.api": ["agentrl.envs.task", "agentrl.envs.session", "agentrl.envs.wire_types"],
}
"""The names each old module offered (its `__all__` where it had one, else every public name it defined),
checked below to be the same objects as in their new homes."""
NAMES: dict[str, set[str]] = {
    "agentrl.envs.api": {
        "AGENT_FAULTS", "ERROR_HTTP_STATUS", "MAX_ARGUMENT_BYTES", "MAX_OUTPUT_CHARS", "MAX_TOOL_CALLS",
        "MESSAGE_BUDGET_S", "SHOWN_CHARS", "Action", "AnswersInText", "BudgetExceeded", "Closable", "EnvError",
        "Episode", "HasOwnTools", "InteractResult", "Session", "StartResult", "StepResult", "Task", "ToolBox",
        "ToolCall", "agent_fault", "cut", "message_budget", "message_deadline", "over_budget", "require", "shown",
        "time_left", "tool_message", "truncate_messages"},
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_path_gives_the_same_objects(old: str) -> None:
    module = importlib.import_module(old)
    homes = [importlib.import_module(m) for m in MOVED[old]]
    for name in sorted(NAMES.get(old, set())):
        assert hasattr(module, name), f"{old} no longer offers {name}"
        found = [vars(h)[name] for h in homes if name in vars(h)]
        assert found, f"{name} of {old} is in none of {MOVED[old]}"
        assert all(getattr(module, name) is f for f in found), f"{old}.{name} is a copy, not the object itself"
