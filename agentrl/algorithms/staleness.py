"""Staleness of off-policy trajectories (docs/architecture.md §5 steps 5–6).

With asynchronous rollout and cross-policy sampling, each action token records the policy version
that sampled it. A trajectory's staleness is how many versions its *oldest* action token is behind
the trainer; the trainer drops trajectories staler than `max_staleness` (and counts them).

The one staleness rule, per trajectory, for everything that filters or bounds by it: the trainer's queue
(`transport.queue`, on arrival and at each new version), the step's selection (`trainer.select`), a rollout
rank's admission (`admit_limit`, `rollout.role.RolloutLoop`) and the planner that models them (`bench.planner`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentrl.types import Trajectory


def version_staleness(oldest_version: int, version: int) -> int:
    """Versions between `version` and an oldest action token sampled by `oldest_version` (< 0: no action
    token, staleness 0)."""
    return version - oldest_version if oldest_version >= 0 else 0


def trajectory_staleness(traj: Trajectory, version: int) -> int:
    """Versions between `version` and the trajectory's oldest action token of the current pool (0 if none).

    Tokens of the lagging pool (cross-policy sampling) are old on purpose and bounded apart, by
    `lagging_staleness`: counting them here would drop every trajectory that used the lagging pool."""
    return version_staleness(traj.oldest_version(lagging=False), version)


def lagging_staleness(traj: Trajectory, version: int) -> int:
    """Versions between `version` and the trajectory's oldest action token of the lagging pool (0 if none)."""
    return version_staleness(traj.oldest_version(lagging=True), version)


def is_stale(traj: Trajectory, version: int, max_staleness: int, lagging_max_staleness: int) -> bool:
    """Whether the trajectory is too old to train on at `version`: current-pool tokens more than
    `max_staleness` behind, or lagging-pool tokens more than `lagging_max_staleness` behind."""
    return (trajectory_staleness(traj, version) > max_staleness
            or lagging_staleness(traj, version) > lagging_max_staleness)


def admit_limit(max_staleness: int, engine_version: int, base_version: int, groups_per_step: int) -> int:
    """Groups a rollout rank may have started: AReaL's bound, counted from the version this life of the rank
    began on (`base_version`), with the engine's version (the one that samples them). A group started under it
    is at most `max_staleness` versions old when the trainer takes it."""
    return (max_staleness + engine_version - base_version + 1) * groups_per_step

