"""Moved to `agentrl.envs.checks.contract` (the checks of envs/ live in `agentrl.envs.checks`); this module
re-exports its names so that imports of `agentrl.envs.contract` keep working."""
from agentrl.envs.checks.contract import (
    TOOL_NAME,
    ContractError,
    ContractReport,
    check_indices,
    check_malformed,
    check_protocol,
    check_task,
    check_tools,
    malformed_moves,
    play_expert,
)

__all__ = ["TOOL_NAME", "ContractError", "ContractReport", "check_indices", "check_malformed", "check_protocol",
           "check_task", "check_tools", "malformed_moves", "play_expert"]
