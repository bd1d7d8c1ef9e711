"""Moved to `agentrl.envs.checks.replay` (the checks of envs/ live in `agentrl.envs.checks`). This package
re-exports its names, and makes each of its modules importable under the old path too
(`agentrl.envs.replay.suite` is `agentrl.envs.checks.replay.suite`, the same module object)."""
import sys

from agentrl.envs.checks.replay import (
    DATA,
    HOST,
    NETWORK,
    NETWORK_COMMANDS,
    OURS,
    Outcome,
    build,
    check,
    classes,
    db_replay,
    os_replay,
    replay_db,
    replay_os,
    run_checks,
    suite,
)

for _module in (classes, db_replay, os_replay, suite):
    sys.modules[f"{__name__}.{_module.__name__.rpartition('.')[2]}"] = _module

__all__ = ["DATA", "HOST", "NETWORK", "NETWORK_COMMANDS", "OURS", "Outcome", "build", "check", "classes", "db_replay",
           "os_replay", "replay_db", "replay_os", "run_checks", "suite"]
