"""Moved to `agentrl.envs.checks.attacks` (the checks of envs/ live in `agentrl.envs.checks`). This package
re-exports its names, and makes each of its modules importable under the old path too
(`agentrl.envs.attacks.runner` is `agentrl.envs.checks.attacks.runner`, the same module object)."""
import sys

from agentrl.envs.checks.attacks import (
    Attack,
    AttackResult,
    attacks_for,
    flood,
    flooder,
    library,
    play_attacks,
    resources,
    runner,
)

for _module in (flood, flooder, library, resources, runner):
    sys.modules[f"{__name__}.{_module.__name__.rpartition('.')[2]}"] = _module

__all__ = ["Attack", "AttackResult", "attacks_for", "flood", "flooder", "library", "play_attacks", "resources",
           "runner"]
