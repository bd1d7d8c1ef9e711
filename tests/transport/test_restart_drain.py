"""A trainer restart reconciled: shards of two rollout ranks, a queue that trained some groups and held
others when it died, and a restarted queue that drains every shard from its checkpointed ledger.
Nothing is trained twice; every trajectory is trained once or counted under one reason."""
from __future__ import annotations

from pathlib import Path

from agentrl.transport.queue import TrajectoryQueue
from agentrl.transport.shards import ShardReader, ShardWriter, rank_dirs, shard_dir
from agentrl.types import Status, Trajectory, TrajectoryBuilder


def traj(rank: int, g: int, m: int, version: int, status: Status = Status.COMPLETED) -> Trajectory:
    b = TrajectoryBuilder()
    b.add_context([1, 2, 3])
    b.add_action([4, 5], [-0.1, -0.2], version=version, engine=rank)
    return b.build(traj_id=f"r{rank}g{g}m{m}", task="os", index=str(g), group_id=f"r{rank}g{g}", reward=float(m),
                   status=status, num_turns=1)


def drain(q: TrajectoryQueue, run_dir: Path) -> None:
    for d in rank_dirs(run_dir, "rollout").values():
        for _, trajs in ShardReader(d).scan():
            q.put_many(trajs)


def test_restart_drains_shards_against_the_ledger(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    sent: list[Trajectory] = []
    for rank in (0, 1):
        w = ShardWriter(shard_dir(run_dir, "rollout", rank))
        for g in range(6):  # one shard per group, as a rollout rank writes before sending
            group = [traj(rank, g, m, version=g // 2, status=Status.ENV_ERROR if (g, m) == (3, 1) else
                          Status.COMPLETED) for m in range(3)]
            w.write(group)
            sent += group

    def new_queue() -> TrajectoryQueue:
        return TrajectoryQueue(group_size=3, capacity=100, max_staleness=2, group_timeout_s=60.0, version=2)

    first = new_queue()
    drain(first, run_dir)  # what arrived over MPI before the crash (the shards hold the same)
    trained_1 = [t.traj_id for g in first.take(1, 5) for t in g]
    first.set_version(3)  # published v3, checkpointed, then killed with groups still held
    ckpt = first.state_dict()
    assert first.depth > 0 and len(trained_1) == 14  # r0 g0..g4, g3 shrunk by its env_error

    second = new_queue()
    second.load_state_dict(ckpt)
    drain(second, run_dir)
    trained_2 = [t.traj_id for g in second.take(1, 100) for t in g]
    state = second.state_dict()

    assert not set(trained_1) & set(trained_2)  # nothing trained twice
    accounted = set(trained_1) | set(trained_2) | set(state["excluded"])
    assert accounted == {t.traj_id for t in sent}  # nothing lost silently
    assert set(state["consumed"]) == set(trained_1) | set(trained_2)
    assert state["counts"]["env_error"] == 2  # one per rank, counted once across the restart
    assert state["counts"]["stale"] == sum(r == "stale" for r in state["excluded"].values()) > 0


def test_a_checkpoint_without_the_queue_ledger_still_trains_nothing_twice(tmp_path: Path) -> None:
    """An older checkpoint names only the consumed ids (the trainer state's): those come back as consumed, so
    the drain takes only what was never trained, and the consumed count goes on from them."""
    run_dir = tmp_path / "run"
    w = ShardWriter(shard_dir(run_dir, "rollout", 0))
    for g in range(4):
        w.write([traj(0, g, m, version=2) for m in range(3)])
    first = TrajectoryQueue(group_size=3, capacity=100, max_staleness=2, group_timeout_s=60.0, version=2)
    drain(first, run_dir)
    trained_1 = {t.traj_id for g in first.take(1, 2) for t in g}
    second = TrajectoryQueue(group_size=3, capacity=100, max_staleness=2, group_timeout_s=60.0, version=2)
    second.mark_consumed(trained_1)
    second.mark_consumed(trained_1)  # idempotent
    drain(second, run_dir)
    trained_2 = {t.traj_id for g in second.take(1, 100) for t in g}
    assert len(trained_1) == len(trained_2) == 6 and not trained_1 & trained_2
    assert second.counts["consumed"] == 12 and set(second.state_dict()["consumed"]) == trained_1 | trained_2
    assert second.counts["duplicate"] == 6
