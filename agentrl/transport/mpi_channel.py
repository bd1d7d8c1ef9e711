"""The MPI channel between the trainer and the rollout ranks (docs/architecture.md §1, §6): trajectories one way,
weight-version notices the other, in one MPMD world (`mpiexec -n 1 python -m mpi4py trainer : -n 2 python -m
mpi4py rollout`, or `srun --mpi=pmi2 --het-group=0 ... : --het-group=1 ...`): `MpiTrainerChannel.world(...)`
on the trainer's hub rank, `MpiRolloutChannel.world(rank)` on each rollout rank; peers are ranks of
COMM_WORLD. It keeps the contract of `agentrl.transport.channel` (closing included: a timeout warns, never
raises). Protocol details for whoever wires it: docs/pipeline.md.

Roles launched separately (their own jobs) use the file channel instead: an MPI port mode (Open_port /
Accept / Connect) was here once, used by no launcher, and removed (git history has it, with the reasons it
needed a file handshake: with the `mpich` wheel a pending Accept spins a core and a Connect to a dead
trainer's port segfaults).

The channel probes its communicator with ANY_TAG (MPI keeps one sender's messages in order only for
receives that match them all), so it must be the only point-to-point user of it: on COMM_WORLD that
holds while the roles talk among themselves through torch.distributed; otherwise pass `comm=` a
communicator of its own (e.g. `COMM_WORLD.Dup()`, made by every rank at start).

Data messages are typed buffers (`codec.encode`), sent with `Isend`; each buffer stays referenced until
its request completes. Receives poll with a matched `Improbe` and a short sleep, never a blocking `Recv`
(which busy-polls a core). Joining has a timeout whose error names the missing peers.
mpi4py is imported on first use, so importing this module initializes no MPI.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentrl.transport import codec
from agentrl.transport.channel import Notice, PolledInbox, warn_not_closed
from agentrl.types import Trajectory

TAG_TRAJ = 11  # rollout → trainer: uint8 buffer from codec.encode
TAG_NOTICE = 12  # trainer → rollout: int64[2] (version, stop)
TAG_HELLO = 13  # rollout → trainer: int64[1] (rollout rank); answered by a notice
TAG_BYE = 14  # rollout → trainer: int64[1] (rollout rank); trainer answers with TAG_BYE int64[1]

__all__ = ["MpiRolloutChannel", "MpiTrainerChannel", "Notice"]


def _mpi() -> Any:
    from mpi4py import MPI  # lazily: importing the module must not initialize MPI

    return MPI


@dataclass
class _Peer:
    comm: Any  # MPI.Comm (COMM_WORLD, or the communicator passed as `comm=`)
    rank: int  # the peer's rank in `comm`
    rollout_rank: int
    closed: bool = False


class _Sends:
    """Outstanding Isends with the buffers they read, kept alive until each request completes."""

    def __init__(self) -> None:
        self.pending: list[tuple[Any, np.ndarray]] = []

    def isend(self, comm: Any, buf: np.ndarray, dest: int, tag: int) -> None:
        MPI = _mpi()
        dtype = MPI.BYTE if buf.dtype == np.uint8 else MPI.INT64_T
        self.pending.append((comm.Isend([buf, dtype], dest=dest, tag=tag), buf))
        self.progress()

    def progress(self) -> int:
        """Test every request (this also drives MPI's progress engine); returns how many are still pending."""
        self.pending = [(r, b) for r, b in self.pending if not r.Test()]
        return len(self.pending)

    def drain(self, deadline: float, poll_s: float) -> bool:
        """Wait until every send completed or `time.monotonic()` passes `deadline`; True if all completed."""
        while self.progress():
            if time.monotonic() > deadline:
                return False
            time.sleep(poll_s)
        return True


def _recv(comm: Any, source: int, tag: int) -> tuple[int, int, np.ndarray] | None:
    """One waiting message as (source, tag, payload) if any, else None (matched probe: no races)."""
    MPI = _mpi()
    status = MPI.Status()
    msg = comm.Improbe(source=source, tag=tag, status=status)
    if msg is None:
        return None
    dtype, np_dtype = (MPI.BYTE, np.uint8) if status.Get_tag() == TAG_TRAJ else (MPI.INT64_T, np.int64)
    buf = np.empty(status.Get_count(dtype), dtype=np_dtype)
    msg.Recv([buf, dtype])
    return status.Get_source(), status.Get_tag(), buf


class MpiTrainerChannel:
    """The trainer's hub rank (`channel.TrainerChannel`): receives trajectories from every rollout rank and
    sends them notices."""

    def __init__(self, peers: list[_Peer], version: int, poll_s: float) -> None:
        self.peers: dict[int, _Peer] = {p.rollout_rank: p for p in peers}
        self.version = version
        self.poll_s = poll_s
        self._sends = _Sends()

    @classmethod
    def world(cls, num_rollout: int, *, version: int = 0, timeout_s: float = 120.0, poll_s: float = 0.002,
              comm: Any = None) -> MpiTrainerChannel:
        """Wait until `num_rollout` rollout ranks of the MPI world have said hello, and answer each.

        Raises:
            TimeoutError: naming the rollout ranks that did not say hello within `timeout_s`.
        """
        ch = cls([], version, poll_s)
        comm = _mpi().COMM_WORLD if comm is None else comm
        deadline = time.monotonic() + timeout_s
        while len(ch.peers) < num_rollout:
            got = _recv(comm, _mpi().ANY_SOURCE, TAG_HELLO)
            if got is not None:
                ch._welcome(_Peer(comm, got[0], int(got[2][0])))
            elif time.monotonic() > deadline:
                missing = sorted(set(range(num_rollout)) - set(ch.peers))
                raise TimeoutError(f"trainer waited {timeout_s:g} s for rollout ranks {missing} in the MPI world; "
                                   f"joined: {sorted(ch.peers)}")
            else:
                time.sleep(poll_s)
        return ch

    def _welcome(self, peer: _Peer) -> None:
        self.peers[peer.rollout_rank] = peer
        self._sends.isend(peer.comm, np.array([self.version, 0], np.int64), peer.rank, TAG_NOTICE)

    def poll(self, max_messages: int = 64) -> list[tuple[int, list[Trajectory]]]:
        """Receive the trajectory messages waiting now (at most `max_messages`), without blocking.

        Also answers hellos (a rank that joins after `world` returned) and byes. Leave messages unreceived
        (do not call this) while the trainer's queue is full: that is the back-pressure the rollout ranks
        see as sends that stay pending.

        Returns:
            [(rollout rank, trajectories)] in arrival order per rank.
        """
        self._sends.progress()
        out: list[tuple[int, list[Trajectory]]] = []
        for comm, peers in self._by_comm():
            while len(out) < max_messages:
                got = _recv(comm, _mpi().ANY_SOURCE, _mpi().ANY_TAG)
                if got is None:
                    break
                source, tag, buf = got
                if tag == TAG_HELLO:
                    self._welcome(_Peer(comm, source, int(buf[0])))
                    peers[source] = self.peers[int(buf[0])]
                    continue
                peer = peers.get(source)
                if peer is None:
                    raise RuntimeError(f"message with tag {tag} from unknown rank {source}")
                if tag == TAG_TRAJ:
                    out.append((peer.rollout_rank, codec.decode(buf)))
                elif tag == TAG_BYE:
                    self._sends.isend(comm, np.array([peer.rollout_rank], np.int64), source, TAG_BYE)
                    peer.closed = True
                else:
                    raise RuntimeError(f"message with foreign tag {tag} from rank {source}: the channel must be "
                                       "the only point-to-point user of its communicator (pass comm=)")
        return out

    def recv(self, timeout_s: float, max_messages: int = 64) -> list[tuple[int, list[Trajectory]]]:
        """Like `poll`, but waits (sleeping `poll_s` between probes) up to `timeout_s` for a message."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = self.poll(max_messages)
            if got or time.monotonic() >= deadline:
                return got
            time.sleep(self.poll_s)

    def _by_comm(self) -> list[tuple[Any, dict[int, _Peer]]]:
        """Open peers grouped by communicator (mpi4py communicators are not hashable: keyed by id)."""
        groups: dict[int, tuple[Any, dict[int, _Peer]]] = {}
        for p in self.peers.values():
            if not p.closed:
                groups.setdefault(id(p.comm), (p.comm, {}))[1][p.rank] = p
        return list(groups.values())

    def notify(self, version: int, stop: bool = False) -> None:
        """Send `Notice(version, stop)` to every open rollout rank (non-blocking)."""
        self.version = version
        for p in self.peers.values():
            if not p.closed:
                self._sends.isend(p.comm, np.array([version, int(stop)], np.int64), p.rank, TAG_NOTICE)

    @property
    def open_ranks(self) -> list[int]:
        """Rollout ranks that have not said bye."""
        return sorted(r for r, p in self.peers.items() if not p.closed)

    def close(self, timeout_s: float = 30.0) -> list[Trajectory]:
        """Tell every rollout rank to stop, and wait up to `timeout_s` for their byes (the contract of
        `channel.TrainerChannel.close`: a timeout is logged, naming the ranks, and `open_ranks` keeps them).

        Returns:
            Trajectories that arrived meanwhile (also in the shards; the caller decides).
        """
        self.notify(self.version, stop=True)
        late: list[Trajectory] = []
        deadline = time.monotonic() + timeout_s
        while self.open_ranks and time.monotonic() <= deadline:
            late += [t for _, batch in self.poll() for t in batch]
            time.sleep(self.poll_s)
        late += [t for _, batch in self.poll() for t in batch]
        if self.open_ranks:
            warn_not_closed("trainer", f"rollout ranks {self.open_ranks}", timeout_s)
        elif not self._sends.drain(max(deadline, time.monotonic() + 1.0), self.poll_s):  # the bye answers: tiny
            warn_not_closed("trainer", f"{len(self._sends.pending)} sends to the rollout ranks", timeout_s)
        return late


class MpiRolloutChannel(PolledInbox):
    """One rollout rank's end (`channel.RolloutChannel`): sends trajectories to the trainer and receives its
    notices (polling them also drives the pending sends)."""

    def __init__(self, comm: Any, trainer: int, rollout_rank: int, poll_s: float, max_pending: int) -> None:
        self.comm, self.trainer, self.rollout_rank = comm, trainer, rollout_rank
        self.poll_s, self.max_pending = poll_s, max_pending
        self._sends = _Sends()
        self._notices: list[Notice] = []
        self.version = -1
        self.stopped = False

    @classmethod
    def world(cls, rollout_rank: int, *, trainer: int = 0, timeout_s: float = 120.0, poll_s: float = 0.002,
              max_pending: int = 8, comm: Any = None) -> MpiRolloutChannel:
        """Say hello to the trainer's world rank `trainer` and wait for its first notice.

        Raises:
            TimeoutError: naming the trainer rank when it does not answer within `timeout_s`.
        """
        comm = _mpi().COMM_WORLD if comm is None else comm
        ch = cls(comm, trainer, rollout_rank, poll_s, max_pending)
        ch._sends.isend(comm, np.array([rollout_rank], np.int64), trainer, TAG_HELLO)
        deadline = time.monotonic() + timeout_s
        while ch.wait_notice(0.0) is None:  # the welcome: `version` is the trainer's now
            if time.monotonic() > deadline:
                raise TimeoutError(f"rollout rank {rollout_rank} waited {timeout_s:g} s for the trainer "
                                   f"(world rank {trainer})")
            time.sleep(poll_s)
        return ch

    @property
    def pending(self) -> int:
        """Sends not yet completed (driving MPI progress on the way)."""
        return self._sends.progress()

    def send(self, trajectories: Sequence[Trajectory], timeout_s: float = 600.0) -> float:
        """Send trajectories to the trainer without waiting for delivery.

        Blocks only while `max_pending` sends are outstanding (the trainer is not receiving: its queue
        is full). Small messages complete locally at once (MPI's eager protocol), so this bound is soft;
        the rollout's admission control (staleness) is the real throttle.

        Returns:
            Seconds spent blocked on back-pressure.

        Raises:
            TimeoutError: the trainer took none of the outstanding sends within `timeout_s`.
        """
        t0 = time.monotonic()
        while self.pending >= self.max_pending:
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(
                    f"rollout rank {self.rollout_rank}: the trainer received nothing for {timeout_s:g} s")
            time.sleep(self.poll_s)
        waited = time.monotonic() - t0
        self._sends.isend(self.comm, codec.encode(trajectories), self.trainer, TAG_TRAJ)
        return waited

    def _pull(self) -> None:
        """Receive waiting notices into the buffer; `version` and `stopped` follow them."""
        self._sends.progress()
        while (got := _recv(self.comm, self.trainer, TAG_NOTICE)) is not None:
            n = Notice(int(got[2][0]), bool(got[2][1]))
            self.version = max(self.version, n.version)
            self.stopped |= n.stop
            self._notices.append(n)

    def close(self, timeout_s: float = 60.0) -> None:
        """Say bye after the outstanding sends, and wait up to `timeout_s` in all for the trainer's answer (the
        contract of `channel.RolloutChannel.close`: a timeout is logged, not raised). Notices that arrive
        meanwhile are kept for `poll_notices`."""
        deadline = time.monotonic() + timeout_s
        if not self._sends.drain(deadline, self.poll_s):
            warn_not_closed(f"rollout rank {self.rollout_rank}",
                            f"the trainer ({len(self._sends.pending)} sends not received)", timeout_s)
            return
        self._sends.isend(self.comm, np.array([self.rollout_rank], np.int64), self.trainer, TAG_BYE)
        while _recv(self.comm, self.trainer, TAG_BYE) is None:
            self._pull()  # notices sent before the answer arrive first: keep them for poll_notices
            if time.monotonic() > deadline:
                warn_not_closed(f"rollout rank {self.rollout_rank}", "the trainer (no answer to bye)", timeout_s)
                return
            time.sleep(self.poll_s)
        self._pull()  # in case a notice sent before the answer is matched only now
        self._sends.drain(deadline, self.poll_s)
