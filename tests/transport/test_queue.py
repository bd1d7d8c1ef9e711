"""The trajectory queue: whole groups only, dynamic batches, staleness, timeouts, exactly once, and every
exclusion counted by reason (checked against a brute-force tally)."""
from __future__ import annotations

import random

import pytest

from agentrl.algorithms.staleness import lagging_staleness, trajectory_staleness
from agentrl.transport.queue import EXCLUSION_REASONS, TrajectoryQueue
from agentrl.types import LAGGING_ENGINE_BASE, Status, Trajectory, TrajectoryBuilder


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def traj(tid: str, group: str, versions: tuple[int, ...] = (5,), status: Status = Status.COMPLETED) -> Trajectory:
    b = TrajectoryBuilder()
    b.add_context([1, 2])
    for v in versions:
        b.add_action([3, 4], [-0.5, -0.25], version=v, engine=0)
    return b.build(traj_id=tid, task="os", index="0", group_id=group, reward=1.0, status=status, num_turns=1)


def queue(**kw) -> tuple[TrajectoryQueue, Clock]:
    clock = Clock()
    args = {"group_size": 2, "capacity": 8, "max_staleness": 2, "group_timeout_s": 10.0, "version": 5}
    return TrajectoryQueue(**(args | kw), clock=clock), clock


def ids(groups: list[list[Trajectory]]) -> list[list[str]]:
    return [[t.traj_id for t in g] for g in groups]


def test_only_complete_groups_and_dynamic_batch() -> None:
    q, _ = queue()
    assert q.put(traj("a1", "A")) is None and q.take(1, 4) == []  # half a group is never released
    q.put_many([traj("b1", "B"), traj("a2", "A"), traj("c1", "C"), traj("b2", "B")])
    assert q.ready_groups == 2 and q.depth == 5
    assert q.take(3, 4) == []  # fewer than min_groups
    assert ids(q.take(1, 1)) == [["a1", "a2"]]  # oldest complete first, at most max_groups
    assert ids(q.take(1, 4)) == [["b1", "b2"]]
    assert q.depth == 1 and q.counts["consumed"] == 4


def test_staleness_on_arrival_and_on_version_advance() -> None:
    assert trajectory_staleness(traj("x", "X", (3, 5)), 7) == 4  # oldest action token decides
    assert trajectory_staleness(traj("x", "X", ()), 7) == 0  # no action token: nothing stale
    q, _ = queue(max_staleness=1)
    assert q.put(traj("old", "A", (3, 5))) == "stale"  # 5 − 3 > 1: its group shrinks to one member
    assert q.put(traj("a2", "A", (5,))) is None and ids(q.take(1, 9)) == [["a2"]]
    q.put_many([traj("b1", "B", (4,)), traj("c1", "C", (5,)), traj("c2", "C", (5,))])
    assert q.set_version(6) == 1  # b1 is now 2 behind
    assert q.counts["stale"] == 2 and q.depth == 2
    assert ids(q.take(1, 9)) == [["c1", "c2"]]


def test_max_staleness_none_keeps_everything() -> None:
    q, _ = queue(max_staleness=None)
    assert q.put(traj("a", "A", (0,))) is None and q.set_version(100) == 0


def test_group_timeout_drops_whole_group_and_late_members() -> None:
    q, clock = queue()
    q.put(traj("a1", "A"))
    clock.now = 9.0
    q.put_many([traj("b1", "B"), traj("b2", "B")])  # complete: never times out
    clock.now = 10.5
    assert ids(q.take(1, 9)) == [["b1", "b2"]]
    assert q.counts["group_timeout"] == 1 and q.depth == 0
    assert q.put(traj("a2", "A")) == "group_timeout"  # the straggler after its group was dropped
    assert q.put(traj("b3", "B")) == "late"  # a member after its group was released


def test_infra_outcomes_shrink_or_wait() -> None:
    q, _ = queue(group_size=3)
    assert q.put(traj("a1", "A", status=Status.ENV_ERROR)) == "env_error"
    q.put(traj("a2", "A"))
    assert q.take(1, 9) == []
    assert q.put(traj("a3", "A", status=Status.CANCELLED)) == "cancelled"
    assert ids(q.take(1, 9)) == [["a2"]]  # shrunk to the member that finished
    q.put_many([traj(f"z{i}", "Z", status=Status.ENV_ERROR) for i in range(3)])
    assert q.depth == 0 and q.take(1, 9) == [] and q.put(traj("z9", "Z")) == "late"  # nothing to train

    q, _ = queue(shrink_on_infra=False)
    q.put_many([traj("a1", "A", status=Status.ENV_ERROR), traj("a2", "A")])
    assert q.take(1, 9) == []  # waits for the retry
    q.put(traj("a1-retry", "A"))
    assert ids(q.take(1, 9)) == [["a2", "a1-retry"]]


def test_exactly_once_by_traj_id_and_through_a_checkpoint() -> None:
    q, _ = queue()
    q.put_many([traj("a1", "A"), traj("a2", "A"), traj("b1", "B"), traj("c1", "C", status=Status.ENV_ERROR)])
    assert q.put(traj("b1", "B")) == "duplicate"  # held
    assert len(q.take(1, 9)) == 1
    assert q.put(traj("a1", "A")) == "duplicate"  # consumed
    state = q.state_dict()
    assert state["counts"]["accepted"] == 2  # b1 is held: it will be accepted again when drained

    q2, _ = queue()  # a restarted trainer drains every shard again
    q2.load_state_dict(state)
    got = q2.put_many([traj("a1", "A"), traj("a2", "A"), traj("b1", "B"), traj("b2", "B"),
                       traj("c1", "C", status=Status.ENV_ERROR), traj("c2", "C")])
    assert got == {"duplicate": 3}
    assert ids(q2.take(1, 9)) == [["b1", "b2"], ["c2"]]  # c's group shrinks again for its env_error
    assert q2.counts["env_error"] == 1 and q2.counts["consumed"] == 5


def test_capacity_counts_complete_groups_and_metrics() -> None:
    q, _ = queue(capacity=3)
    q.put_many([traj("a1", "A"), traj("b1", "B"), traj("c1", "C"), traj("d1", "D")])
    assert not q.full and q.free == 3  # four held, none in a complete group: receiving must go on
    q.put(traj("a2", "A"))
    assert not q.full and q.free == 1 and q.ready_depth == 2
    q.put_many([traj("b2", "B"), traj("c2", "C")])  # put never refuses: the caller stops receiving
    assert q.full and q.free == 0 and q.ready_depth == 6
    m = q.metrics()
    assert m["pipeline/queue_depth"] == 7.0 and m["pipeline/queue_ready_groups"] == 3.0
    assert {k.rsplit("/", 1)[1] for k in m if "/excluded/" in k} == set(EXCLUSION_REASONS)
    with pytest.raises(ValueError):
        TrajectoryQueue(group_size=4, capacity=3, max_staleness=0, group_timeout_s=1.0)


@pytest.mark.parametrize("seed", range(5))
def test_every_trajectory_accounted_for_once(seed: int) -> None:
    """Random arrivals (shuffled, duplicated, infra, stale, stragglers): consumed + excluded = distinct
    ids, no id both, and the counts equal a tally of the ledger."""
    rng = random.Random(seed)
    q, clock = queue(group_size=4, capacity=1000, max_staleness=2, group_timeout_s=5.0, version=10)
    sent: list[Trajectory] = []
    for g in range(40):
        for m in range(rng.choice([2, 3, 4, 4, 4])):  # some groups never complete
            status = rng.choice([Status.COMPLETED] * 8 + [Status.ENV_ERROR, Status.CANCELLED])
            sent.append(traj(f"g{g}m{m}", f"G{g}", (rng.randint(8, 10),), status))
    arrivals = list(sent)
    for i in range(0, len(arrivals), 8):  # out of order, but groups stay roughly together
        window = arrivals[i:i + 8]
        rng.shuffle(window)
        arrivals[i:i + 8] = window
    for t in rng.sample(sent, 15):
        arrivals.insert(rng.randrange(len(arrivals) + 1), t)
    taken: list[str] = []
    for i, t in enumerate(arrivals):
        clock.now = i * 0.1
        q.put(t)
        if i % 17 == 0:
            q.set_version(q.version + (i % 2))
            taken += [t.traj_id for g in q.take(1, 3) for t in g]
    clock.now += 100
    taken += [t.traj_id for g in q.take(1, 1000) for t in g]
    q.expire()
    state = q.state_dict()
    assert len(taken) == len(set(taken)) and set(taken) == set(state["consumed"])
    assert not set(taken) & set(state["excluded"])
    assert set(taken) | set(state["excluded"]) == {t.traj_id for t in sent} and q.depth == 0
    for reason in EXCLUSION_REASONS[:-1]:
        assert q.counts[reason] == sum(r == reason for r in state["excluded"].values()), reason
    assert q.counts["duplicate"] == 15
    assert min(q.counts[r] for r in ("consumed", "stale", "env_error", "cancelled", "group_timeout")) > 0


def test_trajectories_of_a_discarded_lineage_are_orphaned() -> None:
    """A trainer resumed at v5 drains shards holding tokens of v6 (published after its checkpoint, then
    discarded): those are excluded as orphaned and their group shrinks; older ones are held as usual."""
    q, _ = queue(version=5)
    assert q.put(traj("a", "G", (5, 6))) == "orphaned"
    assert q.put(traj("b", "G", (4,))) is None
    assert q.counts["orphaned"] == 1 and q.state_dict()["excluded"] == {"a": "orphaned"}
    assert ids(q.take(1, 1)) == [["b"]]  # the group shrank to the one member it can still have
    assert q.put(traj("a", "G", (5, 6))) == "duplicate"  # and a second drain does not count it again


def mixed(tid: str, group: str, current: tuple[int, ...], lagging: tuple[int, ...]) -> Trajectory:
    """Turns of the current engine (id 0) and of a lagging engine (cross-policy sampling), interleaved."""
    b = TrajectoryBuilder()
    b.add_context([1, 2])
    for v in current:
        b.add_action([3], [-0.5], version=v, engine=0)
    for v in lagging:
        b.add_action([4], [-0.5], version=v, engine=LAGGING_ENGINE_BASE)
    return b.build(traj_id=tid, task="os", index="0", group_id=group, reward=1.0, status=Status.COMPLETED,
                   num_turns=1)


def test_lagging_pool_tokens_have_their_own_staleness_bound() -> None:
    """max_staleness bounds the current pool's tokens; the lagging pool's (old on purpose) get max_staleness + K."""
    t = mixed("a", "g", current=(9, 10), lagging=(4,))
    assert trajectory_staleness(t, 10) == 1 and lagging_staleness(t, 10) == 6
    assert trajectory_staleness(mixed("b", "g", (), (4,)), 10) == 0  # lagging turns alone: no current staleness
    q, _ = queue(version=10, max_staleness=2, lagging_max_staleness=2 + 5)
    assert q.put(t) is None  # lagging 6 <= 7, current 1 <= 2: kept (with one bound it would be stale)
    assert q.put(mixed("c", "g2", (10,), (2,))) == "stale"  # lagging 8 > 7
    assert q.put(mixed("d", "g3", (7,), (10,))) == "stale"  # current 3 > 2
    assert q.set_version(11) == 0 and q.set_version(12) == 1  # at 12 "a": current 3 > 2
    q1, _ = queue(version=10, max_staleness=2)  # no lagging bound given: the same bound for both pools
    assert q1.put(mixed("e", "g", (10,), (4,))) == "stale"



@pytest.mark.parametrize("in_flight_groups", [8, 32, 64])
def test_back_pressure_never_stalls_with_more_in_flight_than_capacity(in_flight_groups: int) -> None:
    """The trainer's receive rule (receive only while not `full`, then `take`) against a rollout with more
    episodes in flight than the queue's capacity, finishing interleaved across groups (first members of every
    group, then second members, ...): every group is trained, none waits for its timeout, and what the queue
    holds in complete groups stays bounded (capacity plus the groups one receive completes).
    Before `full` counted complete groups only, 32 groups of 4 against a capacity of 64 stalled: 64 members
    held, no group complete, the rest unreceived until `group_timeout_s`."""
    group_size, max_groups, batch = 4, 4, 8  # bench_pipeline's shape; one MPI message = `batch` trajectories
    capacity = 4 * max_groups * group_size  # the default: 64
    q, clock = queue(group_size=group_size, capacity=capacity, group_timeout_s=600.0)
    arrivals = [traj(f"g{g}-{m}", f"g{g}") for m in range(group_size) for g in range(in_flight_groups)]
    trained, polls, peak_ready = [], 0, 0
    while len(trained) < in_flight_groups:
        polls += 1
        assert polls < 10 * in_flight_groups, f"stalled: {len(trained)} groups trained, queue {q.depth}"
        if not q.full and arrivals:
            q.put_many(arrivals[:batch])
            del arrivals[:batch]
        peak_ready = max(peak_ready, q.ready_depth)
        trained += q.take(1, max_groups)
        clock.now += 0.1
    assert q.counts["group_timeout"] == 0 and q.counts["consumed"] == in_flight_groups * group_size
    assert peak_ready <= capacity - 1 + batch * group_size  # each received member completes at most one group
    assert sorted(t.traj_id for g in trained for t in g) == sorted(f"g{g}-{m}" for g in range(in_flight_groups)
                                                                   for m in range(group_size))
