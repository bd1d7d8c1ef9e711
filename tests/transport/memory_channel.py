"""The trainer↔rollout channel inside one process: the contract of `agentrl.transport.channel` over shared
Python objects, so that the trainer's hub loop and rollout ranks can run together in a test (threads, or a
rollout rank's asyncio loop on a thread of its own) without mpiexec or a run directory.

    world = MemoryWorld(ranks=2)
    trainer = world.trainer(version=0)       # on the trainer's thread: waits for both ranks' hello
    ch = world.rollout(rank)                 # on each rollout rank's thread: waits for the trainer
    # or, from one thread: trainer, rollouts = memory_channels(2, version=0)

Semantics are the MPI channel's, made exact: every notice reaches every open rank in order (none coalesced);
a batch is handed over when `send` returns (the trainer takes it with `poll`, or gets it from `close` as
late), and `send` blocks while `max_pending` of this rank's batches are still untaken, which is the
back-pressure MPI shows only for messages too large to go eagerly. Batches are passed by reference, not
copied. Not a transport for real runs: nothing survives the process.
"""
from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Sequence

from agentrl.transport.channel import Notice, warn_not_closed
from agentrl.types import Trajectory


class MemoryWorld:
    """Where one trainer end and `ranks` rollout ends meet; all shared state is behind one condition."""

    def __init__(self, ranks: int, *, max_pending: int = 8, poll_s: float = 0.001) -> None:
        self.ranks, self.max_pending, self.poll_s = ranks, max_pending, poll_s
        self._cond = threading.Condition()
        self._trainer_version: int | None = None  # set when the trainer's end is open
        self._stopped = False
        self._hello: set[int] = set()
        self._bye: set[int] = set()
        self._inbox: deque[tuple[int, list[Trajectory]]] = deque()
        self._untaken: Counter[int] = Counter()  # rank -> its batches in the inbox
        self._notices: dict[int, list[Notice]] = {}  # rank -> notices it has not pulled

    def _say_hello(self, rank: int) -> None:
        if not 0 <= rank < self.ranks:
            raise ValueError(f"rollout rank {rank} is not one of the world's {self.ranks}")
        with self._cond:
            self._hello.add(rank)
            self._bye.discard(rank)  # a rank that joins again after closing (a restart)
            self._notices[rank] = []
            self._cond.notify_all()

    def trainer(self, version: int = 0, timeout_s: float = 120.0) -> MemoryTrainerChannel:
        """Open the trainer's end at `version` and wait until every rollout rank has said hello.

        Raises:
            TimeoutError: naming the rollout ranks that did not join within `timeout_s`.
        """
        with self._cond:
            if self._trainer_version is not None:
                raise RuntimeError("this MemoryWorld has a trainer already")
            self._trainer_version = version
            self._cond.notify_all()
            if not self._cond.wait_for(lambda: len(self._hello) == self.ranks, timeout_s):
                missing = sorted(set(range(self.ranks)) - self._hello)
                raise TimeoutError(f"trainer waited {timeout_s:g} s for rollout ranks {missing} in memory; "
                                   f"joined: {sorted(self._hello)}")
        return MemoryTrainerChannel(self, version)

    def rollout(self, rank: int, timeout_s: float = 120.0) -> MemoryRolloutChannel:
        """Say hello as rollout rank `rank` and wait for the trainer's end; its version is the welcome.

        Raises:
            TimeoutError: the trainer did not open within `timeout_s`.
        """
        self._say_hello(rank)
        with self._cond:
            if not self._cond.wait_for(lambda: self._trainer_version is not None, timeout_s):
                raise TimeoutError(f"rollout rank {rank} waited {timeout_s:g} s for the trainer (in memory)")
            version, stopped = self._trainer_version, self._stopped
        assert version is not None
        return MemoryRolloutChannel(self, rank, version, stopped)


def memory_channels(ranks: int, version: int = 0, *, max_pending: int = 8
                    ) -> tuple[MemoryTrainerChannel, list[MemoryRolloutChannel]]:
    """Both ends at once, from one thread: the trainer at `version` and rollout ranks 0..ranks-1."""
    world = MemoryWorld(ranks, max_pending=max_pending)
    for r in range(ranks):
        world._say_hello(r)
    trainer = world.trainer(version, timeout_s=0.0)
    return trainer, [world.rollout(r, timeout_s=0.0) for r in range(ranks)]


class MemoryTrainerChannel:
    """The trainer's end (`channel.TrainerChannel`). Use it from one thread."""

    def __init__(self, world: MemoryWorld, version: int) -> None:
        self.world, self.version = world, version

    def _take(self, max_messages: int) -> list[tuple[int, list[Trajectory]]]:
        """Under the lock: up to `max_messages` batches out of the inbox, waking senders blocked on them."""
        w = self.world
        out = []
        while w._inbox and len(out) < max_messages:
            rank, batch = w._inbox.popleft()
            w._untaken[rank] -= 1
            out.append((rank, batch))
        if out:
            w._cond.notify_all()
        return out

    def poll(self, max_messages: int = 64) -> list[tuple[int, list[Trajectory]]]:
        """The batches waiting now (at most `max_messages`), without blocking; per rank in send order."""
        with self.world._cond:
            return self._take(max_messages)

    def recv(self, timeout_s: float, max_messages: int = 64) -> list[tuple[int, list[Trajectory]]]:
        """Like `poll`, but waits up to `timeout_s` for a batch."""
        with self.world._cond:
            self.world._cond.wait_for(lambda: bool(self.world._inbox), timeout_s)
            return self._take(max_messages)

    def notify(self, version: int, stop: bool = False) -> None:
        """Queue `Notice(version, stop)` for every open rollout rank."""
        w = self.world
        self.version = version
        with w._cond:
            w._trainer_version = version
            w._stopped |= stop
            for r in w._hello - w._bye:
                w._notices[r].append(Notice(version, stop))
            w._cond.notify_all()

    @property
    def open_ranks(self) -> list[int]:
        """Rollout ranks that joined and have not closed."""
        with self.world._cond:
            return sorted(self.world._hello - self.world._bye)

    def close(self, timeout_s: float = 30.0) -> list[Trajectory]:
        """Stop every rollout rank, wait up to `timeout_s` for them to close (taking what they send meanwhile,
        so that none stays blocked in `send`); a timeout is logged, naming the ranks, not raised.

        Returns:
            The trajectories that arrived while waiting.
        """
        self.notify(self.version, stop=True)
        w = self.world
        late: list[Trajectory] = []
        deadline = time.monotonic() + timeout_s
        with w._cond:
            while True:
                # a rank's bye comes after its last send (same lock): taken after the bye, all of it is here
                done = not (w._hello - w._bye)
                late += [t for _, batch in self._take(1 << 30) for t in batch]
                left = deadline - time.monotonic()
                if done or left <= 0:
                    break
                w._cond.wait(left)
            missing = sorted(w._hello - w._bye)
        if missing:
            warn_not_closed("trainer", f"rollout ranks {missing}", timeout_s)
        return late


class MemoryRolloutChannel:
    """One rollout rank's end (`channel.RolloutChannel`). Use it from one thread (its asyncio loop's, say);
    any number of rollout ends and the trainer's may run on other threads."""

    def __init__(self, world: MemoryWorld, rank: int, version: int, stopped: bool) -> None:
        self.world, self.rollout_rank = world, rank
        self.version, self.stopped = version, stopped  # the welcome: not a queued notice
        self._notices: list[Notice] = []

    def _pull(self) -> None:
        """Under the lock: move this rank's new notices here; `version` and `stopped` follow them."""
        got, self.world._notices[self.rollout_rank] = self.world._notices[self.rollout_rank], []
        for n in got:
            self.version = max(self.version, n.version)
            self.stopped |= n.stop
        self._notices += got

    def poll_notices(self) -> list[Notice]:
        """Notices not yet returned, oldest first, without blocking."""
        with self.world._cond:
            self._pull()
        out, self._notices = self._notices, []
        return out

    def wait_notice(self, timeout_s: float) -> Notice | None:
        """The next notice not yet returned, waiting up to `timeout_s`; None on timeout."""
        w = self.world
        with w._cond:
            w._cond.wait_for(lambda: bool(self._notices or w._notices[self.rollout_rank]), timeout_s)
            self._pull()
        return self._notices.pop(0) if self._notices else None

    @property
    def pending(self) -> int:
        """This rank's batches the trainer has not taken yet."""
        with self.world._cond:
            return self.world._untaken[self.rollout_rank]

    def send(self, trajectories: Sequence[Trajectory], timeout_s: float = 600.0) -> float:
        """Hand one batch to the trainer; blocks while `max_pending` of this rank's batches are untaken.

        Returns:
            Seconds spent blocked on back-pressure.

        Raises:
            TimeoutError: the trainer took none of them within `timeout_s`.
        """
        w, r = self.world, self.rollout_rank
        t0 = time.monotonic()
        with w._cond:
            if not w._cond.wait_for(lambda: w._untaken[r] < w.max_pending, timeout_s):
                raise TimeoutError(f"rollout rank {r}: the trainer took nothing for {timeout_s:g} s")
            w._inbox.append((r, list(trajectories)))
            w._untaken[r] += 1
            w._cond.notify_all()
        return time.monotonic() - t0

    def close(self, timeout_s: float = 60.0) -> None:
        """Say bye (after the last `send`). Waits for nothing: what was sent is the trainer's already."""
        with self.world._cond:
            self._pull()  # notices sent before the bye stay readable, as on the other channels
            self.world._bye.add(self.rollout_rank)
            self.world._cond.notify_all()
