"""Moved to `agentrl.envs.checks.expert` (the checks of envs/ live in `agentrl.envs.checks`); this module
re-exports its names so that imports of `agentrl.envs.expert` keep working."""
from agentrl.envs.checks.expert import (
    play,
)

__all__ = ["play"]
