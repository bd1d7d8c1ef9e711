"""The one staleness rule, by hand: a trajectory's staleness per pool, when it is too old, and a rollout rank's
admission bound."""
from __future__ import annotations

from agentrl.algorithms.staleness import admit_limit, is_stale, version_staleness
from agentrl.types import LAGGING_ENGINE_BASE, Status, Trajectory, TrajectoryBuilder


def mixed(current: tuple[int, ...], lagging: tuple[int, ...]) -> Trajectory:
    """One turn per version: the current engine's (id 0), then a lagging engine's."""
    b = TrajectoryBuilder()
    b.add_context([1, 2])
    for v in current:
        b.add_action([1], [-0.1], version=v, engine=0)
    for v in lagging:
        b.add_action([2], [-0.1], version=v, engine=LAGGING_ENGINE_BASE)
    return b.build(traj_id="t", task="t", index="0", group_id="g", reward=1.0, status=Status.COMPLETED,
                   num_turns=1)


def test_version_staleness() -> None:
    assert version_staleness(7, 10) == 3
    assert version_staleness(10, 10) == 0
    assert version_staleness(-1, 10) == 0  # no action token


def test_each_pool_has_its_own_bound() -> None:
    t = mixed(current=(9, 10), lagging=(4,))  # current pool 1 behind at version 10, lagging pool 6
    assert not is_stale(t, 10, max_staleness=1, lagging_max_staleness=6)
    assert is_stale(t, 10, max_staleness=0, lagging_max_staleness=6)
    assert is_stale(t, 10, max_staleness=1, lagging_max_staleness=5)
    assert not is_stale(mixed(current=(), lagging=(9,)), 10, max_staleness=0, lagging_max_staleness=1)


def test_admit_limit() -> None:
    # bound 2, engine at v3 in a life that began at v1, 4 groups a step: (2 + 3 - 1 + 1) * 4
    assert admit_limit(2, 3, 1, 4) == 20
    assert admit_limit(0, 0, 0, 8) == 8  # synchronous: one step's groups
