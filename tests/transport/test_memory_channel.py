"""The in-memory channel's own guarantees beyond the shared contract (test_channel_contract.py): rollout ranks
running asyncio loops on threads of their own against a trainer on this one (exactly once, in order, under
concurrency), back-pressure at `max_pending`, and joins that time out naming whom they waited for."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from agentrl.transport.channel import Notice
from agentrl.types import Status, Trajectory, TrajectoryBuilder
from tests.transport.memory_channel import MemoryWorld, memory_channels


def traj(rank: int, i: int) -> Trajectory:
    b = TrajectoryBuilder()
    b.add_action([1, 2], [-0.5, -0.5], version=0, engine=rank)
    return b.build(traj_id=f"r{rank}-{i}", task="t", index="0", group_id=f"g{rank}-{i}", reward=1.0, num_turns=1,
                   status=Status.COMPLETED)


async def rollout_rank(world: MemoryWorld, rank: int, batches: int, out: dict[int, list[Notice]]) -> None:
    """A rollout rank as the role runs one: send between awaits, read notices each tick, stop, close."""
    ch = await asyncio.to_thread(world.rollout, rank, 10.0)
    seen: list[Notice] = []
    for i in range(batches):
        ch.send([traj(rank, i)])
        seen += ch.poll_notices()
        await asyncio.sleep(0)
    while not ch.stopped:
        seen += ch.poll_notices()
        await asyncio.sleep(0.001)
    ch.close()
    out[rank] = seen


def test_rollout_ranks_on_asyncio_threads_and_a_trainer_on_this_one() -> None:
    ranks, batches = 3, 200
    world = MemoryWorld(ranks, max_pending=4)
    seen: dict[int, list[Notice]] = {}
    threads = [threading.Thread(target=asyncio.run, args=(rollout_rank(world, r, batches, seen),))
               for r in range(ranks)]
    for t in threads:
        t.start()
    trainer = world.trainer(version=0, timeout_s=10.0)
    got: dict[int, list[str]] = {r: [] for r in range(ranks)}
    deadline = time.monotonic() + 20.0
    while sum(map(len, got.values())) < ranks * batches and time.monotonic() < deadline:
        for rank, batch in trainer.recv(timeout_s=0.05, max_messages=7):
            got[rank] += [t.traj_id for t in batch]
            if len(got[0]) % 50 == 0 and rank == 0:
                trainer.notify(trainer.version + 1)
    late = trainer.close(timeout_s=10.0)
    for t in threads:
        t.join(timeout=10.0)
    assert late == [] and trainer.open_ranks == []
    assert got == {r: [f"r{r}-{i}" for i in range(batches)] for r in range(ranks)}  # each once, in order
    for r in range(ranks):
        assert [n.version for n in seen[r]] == [1, 2, 3, 4, 4] and seen[r][-1] == Notice(4, stop=True)


def test_send_blocks_at_max_pending_until_the_trainer_takes() -> None:
    trainer, (ch,) = memory_channels(1, max_pending=2)
    assert ch.send([traj(0, 0)]) < 0.05 and ch.send([traj(0, 1)]) < 0.05 and ch.pending == 2
    with pytest.raises(TimeoutError, match="rollout rank 0: the trainer took nothing for 0.1 s"):
        ch.send([traj(0, 2)], timeout_s=0.1)
    taker = threading.Timer(0.3, trainer.poll, kwargs={"max_messages": 1})
    taker.start()
    waited = ch.send([traj(0, 3)], timeout_s=5.0)
    taker.join()
    assert 0.25 < waited < 2.0 and ch.pending == 2
    assert [t.traj_id for _, b in trainer.poll() for t in b] == ["r0-1", "r0-3"]  # r0-0 taken by the timer


def test_joins_time_out_naming_the_missing_end() -> None:
    world = MemoryWorld(2)
    with pytest.raises(TimeoutError, match="rollout rank 1 waited 0.1 s for the trainer"):
        world.rollout(1, timeout_s=0.1)  # its hello stays: the trainer below counts it
    with pytest.raises(TimeoutError, match=r"trainer waited 0.1 s for rollout ranks \[0\] in memory; joined: \[1\]"):
        world.trainer(timeout_s=0.1)
    with pytest.raises(ValueError, match="rollout rank 2 is not one of the world's 2"):
        world.rollout(2)


def test_a_rank_that_joins_again_gets_the_current_version_and_only_new_notices() -> None:
    trainer, (first,) = memory_channels(1, version=5)
    trainer.notify(6)
    first.close()
    assert trainer.open_ranks == []
    trainer.notify(7)  # for open ranks only: none
    again = trainer.world.rollout(0, timeout_s=1.0)
    assert (again.version, again.poll_notices(), trainer.open_ranks) == (7, [], [0])
    trainer.notify(8)
    assert again.wait_notice(1.0) == Notice(8) and again.wait_notice(0.0) is None
    assert first.poll_notices() == [Notice(6)]  # pulled at its close, readable after it
