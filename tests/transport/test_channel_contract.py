"""The channel contract (`agentrl.transport.channel`) checked against every channel: one scenario, run on the
in-memory channel and on the file channel (real shard segments and notice files in a tmp run dir): two
rollout ranks send batches, the trainer polls them, notifies versions, stops and closes, and what arrives
after the stop comes back from `close` as late; then a close whose rank never says bye. The MPI channel
runs the same steps under mpiexec in test_mpi_channel.py (close's timeouts included); here its classes are
checked against the protocols, member by member and signature by signature, without MPI."""
from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agentrl.launch import rendezvous
from agentrl.transport.channel import Notice, NoticeInbox, RolloutChannel, TrainerChannel
from agentrl.transport.file_channel import FileRolloutChannel, FileTrainerChannel
from agentrl.transport.mpi_channel import MpiRolloutChannel, MpiTrainerChannel
from agentrl.transport.shards import ShardWriter, shard_dir
from agentrl.types import Status, Trajectory, TrajectoryBuilder
from tests.transport.memory_channel import MemoryRolloutChannel, MemoryTrainerChannel, MemoryWorld

POLL = 0.01
Ends = tuple[TrainerChannel, list[RolloutChannel]]


def traj(rank: int, batch: int, m: int) -> Trajectory:
    b = TrajectoryBuilder()
    b.add_context([1, 2])
    b.add_action([3, 4, 5], [-0.1, -0.2, -0.3], version=3, engine=rank)
    return b.build(traj_id=f"r{rank}b{batch}m{m}", task="lookup", index=str(batch), group_id=f"r{rank}b{batch}",
                   reward=float(m), num_turns=1, status=Status.COMPLETED)


def open_memory(run_dir: Path, ranks: int, version: int) -> Ends:
    """The trainer's open on this thread, each rollout rank joining from a thread of its own."""
    world = MemoryWorld(ranks)
    rollouts: dict[int, MemoryRolloutChannel] = {}
    joins = [threading.Thread(target=lambda r=r: rollouts.__setitem__(r, world.rollout(r, timeout_s=10.0)))
             for r in range(ranks)]
    for t in joins:
        t.start()
    trainer = world.trainer(version, timeout_s=10.0)
    for t in joins:
        t.join(timeout=10.0)
    return trainer, [rollouts[r] for r in range(ranks)]


def open_files(run_dir: Path, ranks: int, version: int) -> Ends:
    """The trainer's open (which waits for hellos) on a thread, the rollout ranks joining from this one."""
    box: dict[str, FileTrainerChannel] = {}
    t = threading.Thread(target=lambda: box.setdefault("ch", FileTrainerChannel.open(
        run_dir, ranks, rendezvous.publish, version=version, timeout_s=10.0, poll_s=POLL)))
    t.start()
    rollouts = [FileRolloutChannel.connect(run_dir, r, rendezvous.read, timeout_s=10.0, poll_s=POLL)
                for r in range(ranks)]
    t.join(timeout=15.0)
    return box["ch"], rollouts


OPENERS: dict[str, Callable[[Path, int, int], Ends]] = {"memory": open_memory, "files": open_files}


@pytest.fixture(params=sorted(OPENERS))
def channel(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Callable[..., Ends], Path]]:
    yield request.param, OPENERS[request.param], tmp_path


class Sender:
    """A rollout rank's side of a send, as the rollout role does it: the shard segment first, then `send`."""

    def __init__(self, run_dir: Path, ch: RolloutChannel) -> None:
        self.ch, self.writer, self.batches = ch, ShardWriter(shard_dir(run_dir, "rollout", ch.rollout_rank)), 0

    def send(self, size: int = 2) -> list[str]:
        batch = [traj(self.ch.rollout_rank, self.batches, m) for m in range(size)]
        self.batches += 1
        self.writer.write(batch)
        assert self.ch.send(batch) >= 0.0
        return [t.traj_id for t in batch]


def poll_until(trainer: TrainerChannel, n: int, timeout_s: float = 5.0) -> list[tuple[int, list[str]]]:
    got: list[tuple[int, list[str]]] = []
    deadline = time.monotonic() + timeout_s
    while sum(len(b) for _, b in got) < n and time.monotonic() < deadline:
        got += [(r, [t.traj_id for t in batch]) for r, batch in trainer.recv(timeout_s=POLL)]
    return got


def notices_until(ch: RolloutChannel, last: Notice, timeout_s: float = 5.0) -> list[Notice]:
    """Notices one by one (`wait_notice`) until `last` (`version` and `stopped` may run ahead: they follow
    every notice the channel has pulled, returned or not)."""
    seen: list[Notice] = []
    deadline = time.monotonic() + timeout_s
    while not (seen and seen[-1] == last) and time.monotonic() < deadline:
        if (n := ch.wait_notice(timeout_s=POLL)) is not None:
            seen.append(n)
    return seen


def test_send_poll_notify_stop_close(channel) -> None:
    kind, open_ends, run_dir = channel
    trainer, rollouts = open_ends(run_dir, 2, 3)
    assert isinstance(trainer, TrainerChannel) and all(isinstance(r, RolloutChannel) for r in rollouts)
    assert trainer.open_ranks == [0, 1] and trainer.version == 3
    assert [(r.rollout_rank, r.version, r.stopped) for r in rollouts] == [(0, 3, False), (1, 3, False)]
    assert [r.poll_notices() for r in rollouts] == [[], []]  # the welcome is not a queued notice

    senders = [Sender(run_dir, r) for r in rollouts]
    sent = {r: senders[r].send() + senders[r].send() for r in (0, 1)}
    got = poll_until(trainer, 8)
    for r in (0, 1):  # per rank: in send order, one batch each, every trajectory once
        assert [b for rank, b in got if rank == r] == [sent[r][:2], sent[r][2:]]
    time.sleep(3 * POLL)
    assert trainer.poll() == []  # nothing twice

    trainer.notify(4)
    trainer.notify(5)
    assert trainer.version == 5
    for r in rollouts:
        seen = notices_until(r, Notice(5))
        assert seen[-1] == Notice(5) and r.version == 5 and not r.stopped
        assert [n.version for n in seen] == sorted(n.version for n in seen)  # never decreasing
        if kind == "memory":
            assert seen == [Notice(4), Notice(5)]  # exact: none coalesced (the file channel may skip 4)

    box: dict[str, list[Trajectory]] = {}
    closer = threading.Thread(target=lambda: box.setdefault("late", trainer.close(timeout_s=10.0)))
    closer.start()
    for r in rollouts:
        assert notices_until(r, Notice(5, stop=True))[-1] == Notice(5, stop=True)
    late_ids = senders[1].send(3)  # after the stop: it reaches the trainer through close
    for r in rollouts:
        r.close(timeout_s=5.0)
    closer.join(timeout=15.0)
    assert [t.traj_id for t in box["late"]] == late_ids
    assert trainer.open_ranks == []
    assert all(r.stopped for r in rollouts)


def test_close_returns_after_its_timeout_naming_the_rank_that_stayed(channel,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    _, open_ends, run_dir = channel
    trainer, rollouts = open_ends(run_dir, 2, 0)
    unread = Sender(run_dir, rollouts[1]).send()  # rank 1 sends, then never closes
    rollouts[0].close(timeout_s=1.0)  # rank 0 leaves before the trainer closes: no wait, no error
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="agentrl.transport"):
        late = trainer.close(timeout_s=0.3)  # does not raise
    assert 0.25 < time.monotonic() - t0 < 3.0
    assert [t.traj_id for t in late] == unread
    assert trainer.open_ranks == [1]
    assert "trainer waited 0.3 s for rollout ranks [1] to close; going on without them" in caplog.messages
    assert notices_until(rollouts[1], Notice(0, stop=True))[-1] == Notice(0, stop=True)  # the stop reached it


PROTOCOLS = [(TrainerChannel, MpiTrainerChannel), (TrainerChannel, FileTrainerChannel),
             (TrainerChannel, MemoryTrainerChannel), (RolloutChannel, MpiRolloutChannel),
             (RolloutChannel, FileRolloutChannel), (RolloutChannel, MemoryRolloutChannel)]


def _members(proto: type) -> list[str]:
    return sorted(n for c in proto.__mro__ if c.__dict__.get("_is_protocol") for n in
                  (*c.__dict__, *c.__dict__.get("__annotations__", {})) if not n.startswith("_"))


@pytest.mark.parametrize(("proto", "cls"), PROTOCOLS, ids=lambda x: x.__name__)
def test_every_channel_has_the_protocols_methods_with_their_signatures(proto: type, cls: type) -> None:
    """Structural conformance beyond `isinstance` (which checks names only): each method takes the protocol's
    parameters with the protocol's defaults, and each property is a property."""
    members = _members(proto)
    assert {"version", "close"} <= set(members)
    for name in members:
        want = inspect.getattr_static(proto, name, None)
        got = inspect.getattr_static(cls, name, None)
        if callable(want):
            assert callable(got), (cls.__name__, name)
            w, g = inspect.signature(want), inspect.signature(got)
            assert [(p.name, p.default) for p in w.parameters.values()] == \
                   [(p.name, p.default) for p in g.parameters.values()], (cls.__name__, name, str(g))
        elif isinstance(want, property):
            assert isinstance(got, property), (cls.__name__, name)


def test_mpi_ends_are_instances_of_the_protocols_without_mpi() -> None:
    """Made without a communicator (nothing here touches MPI): runtime-checkable isinstance on real objects."""
    assert isinstance(MpiTrainerChannel([], version=2, poll_s=POLL), TrainerChannel)
    rollout = MpiRolloutChannel(None, trainer=0, rollout_rank=1, poll_s=POLL, max_pending=8)
    assert isinstance(rollout, RolloutChannel) and isinstance(rollout, NoticeInbox)
    assert not isinstance(rollout, TrainerChannel) and not isinstance(MpiTrainerChannel([], 0, POLL), NoticeInbox)
