"""What the asynchronous pipeline's roles need from the trainer↔rollout channel, as `typing.Protocol`s, and the
one contract every channel keeps (`mpi_channel`, `file_channel`, and the tests' in-memory double
`tests/transport/memory_channel.py`; tested against each in tests/transport/test_channel_contract.py).

Roles type their channel as `TrainerChannel` (the trainer's hub rank) or `RolloutChannel` (one rollout rank)
and never name a transport, so the hub loop and a rollout rank can run together in one process over the
tests' in-memory channel, and under mpiexec or as separate jobs over the others, unchanged.

The contract:

* **Joining.** A channel is made by its transport's own constructor (`world`, `open`/`connect`, `MemoryWorld`),
  which waits until both ends are there (the trainer: every rollout rank; a rollout rank: the trainer) and
  raises `TimeoutError` naming whom it waited for. The trainer's version at that moment is the rollout rank's
  first `version` (the welcome); it is not returned by `poll_notices`.
* **Trajectories** go one way, rollout → trainer, in batches. The rollout rank writes each batch to its shard
  before `send` (durable first): a channel may carry the batch itself (MPI, memory) or read it back from
  the shard (files). `poll` yields each batch of a rank once, in the order that rank sent them; across
  ranks, in any order. Within one life of the trainer's channel delivery is exactly once; across restarts
  it is at least once (a resumed trainer re-reads the shards), and the queue's ledger drops repeats by
  `traj_id`. Senders must not change a batch after sending it (the memory channel hands the objects over).
* **Back-pressure.** The trainer calls `poll` only while its queue has room; what it does not take waits in
  the channel (and in the shards). `send` may block while the trainer takes nothing and returns the seconds
  it waited; it raises `TimeoutError` when the trainer took nothing for `timeout_s`.
* **Notices** go the other way: `notify(version)` after the weights of `version` are complete. A rollout
  rank sees them in order, versions never decreasing; a channel may coalesce them (the file channel keeps
  only the newest), but the newest one always arrives. `version` is the newest version seen; `stopped`
  turns true with the first notice that says stop and stays true.
* **Closing** (the same for every channel): the trainer's `close(timeout_s)` sends stop to every rollout
  rank, waits up to `timeout_s` for each to close its end, and returns the trajectories that arrived
  meanwhile (late: the caller accounts for them). A rollout rank's `close(timeout_s)`, called after its
  last `send`, says bye, waiting up to `timeout_s` as long as its transport needs to deliver what it sent
  and have its leaving seen (MPI: the sends complete and the trainer answers; files, memory: no wait). Neither
  raises on a timeout: the run's work is done by then, and the trainer still has its ledger and reports to
  write; instead both log a warning that names the peers that did not close in time, and the trainer's
  `open_ranks` still names them afterwards. Whatever a rank that did not close sent is in its shards.
  Close each end once.

`NoticeInbox` is the rollout side's view of the notices alone (what a weight source or an admission rule
needs); `PolledInbox` is its implementation for channels that pull notices from somewhere (a communicator,
a file, a shared queue).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from agentrl.types import Trajectory

log = logging.getLogger("agentrl.transport")


@dataclass(frozen=True)
class Notice:
    """The trainer published weights `version`; `stop` asks the rollout rank to finish and close."""

    version: int
    stop: bool = False


@runtime_checkable
class NoticeInbox(Protocol):
    """The rollout side's notices: the newest version the trainer announced, and whether it said stop."""

    version: int  # the newest version announced (the trainer's version at join before any notice)
    stopped: bool  # a stop notice arrived: start nothing new, send what is finished, close

    def poll_notices(self) -> list[Notice]:
        """Notices not yet returned, oldest first, without blocking (updates `version` and `stopped`)."""
        ...

    def wait_notice(self, timeout_s: float) -> Notice | None:
        """The next notice not yet returned, waiting up to `timeout_s`; None on timeout."""
        ...


@runtime_checkable
class RolloutChannel(NoticeInbox, Protocol):
    """One rollout rank's end of the channel."""

    rollout_rank: int  # 0..R-1 within the rollout role, the same number as shards/rollout-<r>

    @property
    def pending(self) -> int:
        """Batches sent that the trainer has not taken yet, as far as this end can tell (0 if it cannot)."""
        ...

    def send(self, trajectories: Sequence[Trajectory], timeout_s: float = 600.0) -> float:
        """Hand one batch (already written to this rank's shard) to the trainer.

        Returns:
            Seconds spent blocked on back-pressure.

        Raises:
            TimeoutError: the trainer took nothing for `timeout_s`.
        """
        ...

    def close(self, timeout_s: float = 60.0) -> None:
        """Say bye after the last `send`; waits up to `timeout_s`, warns instead of raising on a timeout."""
        ...


@runtime_checkable
class TrainerChannel(Protocol):
    """The trainer's hub rank's end: trajectories in from every rollout rank, notices out to them."""

    version: int  # the version last notified (the one given at open before any notice)

    @property
    def open_ranks(self) -> list[int]:
        """Rollout ranks that joined and have not closed, sorted."""
        ...

    def poll(self, max_messages: int = 64) -> list[tuple[int, list[Trajectory]]]:
        """The batches waiting now, at most `max_messages`, without blocking.

        Returns:
            [(rollout rank, one batch)], in send order per rank.
        """
        ...

    def recv(self, timeout_s: float, max_messages: int = 64) -> list[tuple[int, list[Trajectory]]]:
        """Like `poll`, but waits up to `timeout_s` for at least one batch."""
        ...

    def notify(self, version: int, stop: bool = False) -> None:
        """Announce `Notice(version, stop)` to every open rollout rank, without blocking."""
        ...

    def close(self, timeout_s: float = 30.0) -> list[Trajectory]:
        """Stop every rollout rank and wait up to `timeout_s` for them to close; never raises on a timeout.

        Returns:
            The trajectories that arrived while waiting.
        """
        ...


class PolledInbox:
    """`NoticeInbox` for channels that pull notices from somewhere: a subclass sets `poll_s`, `version`,
    `stopped` and `_notices` and defines `_pull()`, which moves what has arrived into `_notices` (and may
    raise, e.g. when the trainer it joined is gone)."""

    poll_s: float
    version: int
    stopped: bool
    _notices: list[Notice]

    def _pull(self) -> None:
        raise NotImplementedError

    def poll_notices(self) -> list[Notice]:
        """Notices not yet returned, oldest first, without blocking."""
        self._pull()
        out, self._notices = self._notices, []
        return out

    def wait_notice(self, timeout_s: float) -> Notice | None:
        """The next notice not yet returned, waiting up to `timeout_s`; None on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._pull()
            if self._notices:
                return self._notices.pop(0)
            if time.monotonic() >= deadline:
                return None
            time.sleep(self.poll_s)


def warn_not_closed(who: str, whom: str, timeout_s: float) -> None:
    """The one warning a `close` that timed out logs, in place of raising: `who` waited for `whom`."""
    log.warning("%s waited %g s for %s to close; going on without them", who, timeout_s, whom)
