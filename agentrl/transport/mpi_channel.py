"""The MPI channel between the trainer and the rollout ranks (design §1, §6): trajectories one way,
weight-version notices the other. Protocol details for whoever wires it: docs/pipeline.md.

Two ways to meet, one channel:

* **One MPMD world** (`mpiexec -n 1 python -m mpi4py trainer : -n 2 python -m mpi4py rollout`, or
  `srun --mpi=pmi2 --het-group=0 ... : --het-group=1 ...`): `TrainerChannel.world(...)` on the trainer's
  hub rank, `RolloutChannel.world(rank)` on each rollout rank; peers are ranks of COMM_WORLD.
* **Separately launched roles** (each its own `mpiexec -n 1` or `srun` step): `TrainerChannel.accept(run_dir,
  ...)` opens an MPI port and writes it to `rendezvous.json` (`mpi_port`); `RolloutChannel.connect(run_dir,
  rank)` joins it. The rendezvous functions are passed in (`agentrl.launch.rendezvous.publish` and
  `.read`): transport does not import launch (design §2). A file handshake in `run_dir/mpi/` comes first
  (see `_Handshake`), because with the `mpich` wheel a pending `Accept` spins a core at 100 % and a
  `Connect` to the port of a dead trainer segfaults: the trainer accepts only when a rollout rank has
  asked, and a rollout rank connects only to a port whose owner has just answered it. Rollout ranks may
  join late or rejoin after a restart.

The channel probes its communicator with ANY_TAG (MPI keeps one sender's messages in order only for
receives that match them all), so it must be the only point-to-point user of it: on COMM_WORLD that
holds while the roles talk among themselves through torch.distributed; otherwise pass `comm=` a
communicator of its own (e.g. `COMM_WORLD.Dup()`, made by every rank at start).

Data messages are typed buffers (`codec.encode`), sent with `Isend`; each buffer stays referenced until
its request completes. Receives poll with a matched `Improbe` and a short sleep, never a blocking `Recv`
(which busy-polls a core). Waiting for peers has a timeout whose error names the missing peers.
mpi4py is imported on first use, so importing this module initializes no MPI.
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.fsio import write_json_atomic
from agentrl.transport import codec
from agentrl.types import Trajectory

TAG_TRAJ = 11  # rollout → trainer: uint8 buffer from codec.encode
TAG_NOTICE = 12  # trainer → rollout: int64[2] (version, stop)
TAG_HELLO = 13  # rollout → trainer: int64[1] (rollout rank); answered by a notice
TAG_BYE = 14  # rollout → trainer: int64[1] (rollout rank); trainer answers with TAG_BYE int64[1]
PORT_KEY = "mpi_port"

Publish = Callable[..., None]  # rendezvous.publish(run_dir, **entries)
Read = Callable[[Path], dict[str, Any]]  # rendezvous.read(run_dir)


def _mpi() -> Any:
    from mpi4py import MPI  # lazily: importing the module must not initialize MPI

    return MPI


@dataclass(frozen=True)
class Notice:
    """The trainer published weights `version`; `stop` asks the rollout rank to finish and close."""

    version: int
    stop: bool = False


class NoticeInbox:
    """The rollout side's notice queue, shared by the MPI and the file channel: a subclass sets `poll_s` and
    `_notices` and defines `_pull()`, which moves what has arrived into `_notices` (and may raise)."""

    poll_s: float
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


@dataclass
class _Peer:
    comm: Any  # MPI.Comm (COMM_WORLD) or MPI.Intercomm (port mode)
    rank: int  # the peer's rank in `comm` (its remote rank for an intercomm)
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

    def drain(self, timeout_s: float, poll_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while self.progress():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.pending)} sends to {what} did not complete within {timeout_s:g} s")
            time.sleep(poll_s)


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


class TrainerChannel:
    """The trainer's hub rank: receives trajectories from every rollout rank and sends them notices."""

    def __init__(self, peers: list[_Peer], version: int, poll_s: float, handshake: _Handshake | None) -> None:
        self.peers: dict[int, _Peer] = {p.rollout_rank: p for p in peers}
        self.version = version
        self.poll_s = poll_s
        self._sends = _Sends()
        self._handshake = handshake
        self._next_join_check = 0.0

    @classmethod
    def world(cls, num_rollout: int, *, version: int = 0, timeout_s: float = 120.0, poll_s: float = 0.002,
              comm: Any = None) -> TrainerChannel:
        """Wait until `num_rollout` rollout ranks of the MPI world have said hello, and answer each.

        Raises:
            TimeoutError: naming the rollout ranks that did not say hello within `timeout_s`.
        """
        ch = cls([], version, poll_s, None)
        comm = _mpi().COMM_WORLD if comm is None else comm
        deadline = time.monotonic() + timeout_s
        while len(ch.peers) < num_rollout:
            got = _recv(comm, _mpi().ANY_SOURCE, TAG_HELLO)
            if got is not None:
                ch._welcome(_Peer(comm, got[0], int(got[2][0])))
            elif time.monotonic() > deadline:
                raise TimeoutError(ch._missing(num_rollout, timeout_s, "in the MPI world"))
            else:
                time.sleep(poll_s)
        return ch

    @classmethod
    def accept(cls, run_dir: str | os.PathLike[str], num_rollout: int, publish: Publish, *, version: int = 0,
               timeout_s: float = 120.0, poll_s: float = 0.002) -> TrainerChannel:
        """Open an MPI port, publish it in rendezvous.json, and accept `num_rollout` rollout ranks.

        Rollout ranks that ask later (late starters, restarts) are accepted by `poll`.

        Args:
            publish: `agentrl.launch.rendezvous.publish`, which merges keys into rendezvous.json.

        Raises:
            TimeoutError: naming the rollout ranks that did not ask to connect within `timeout_s`.
        """
        ch = cls([], version, poll_s, _Handshake.open(Path(run_dir), publish))
        deadline = time.monotonic() + timeout_s
        while len(ch.peers) < num_rollout:
            if not ch._accept_waiting():
                if time.monotonic() > deadline:
                    raise TimeoutError(ch._missing(num_rollout, timeout_s, f"through {run_dir}/rendezvous.json"))
                time.sleep(ch._handshake.poll_s if ch._handshake else poll_s)
        return ch

    def _missing(self, num_rollout: int, timeout_s: float, where: str) -> str:
        missing = sorted(set(range(num_rollout)) - set(self.peers))
        return (f"trainer waited {timeout_s:g} s for rollout ranks {missing} {where}; "
                f"joined: {sorted(self.peers)}")

    def _welcome(self, peer: _Peer) -> None:
        self.peers[peer.rollout_rank] = peer
        self._sends.isend(peer.comm, np.array([self.version, 0], np.int64), peer.rank, TAG_NOTICE)

    def _accept_waiting(self) -> bool:
        """Accept every rollout rank that has asked to connect (port mode); True if any did."""
        assert self._handshake is not None
        joined = False
        for rollout_rank, request in self._handshake.requests():
            inter = self._handshake.accept(rollout_rank, request)
            old = self.peers.get(rollout_rank)
            if old is not None and not old.closed:  # a restarted rank: its old link is dead
                old.closed = True
            self._welcome(_Peer(inter, 0, rollout_rank))
            joined = True
        return joined

    def poll(self, max_messages: int = 64) -> list[tuple[int, list[Trajectory]]]:
        """Receive the trajectory messages waiting now (at most `max_messages`), without blocking.

        Also answers hellos and byes, and (port mode, every 0.5 s) accepts rollout ranks that ask.
        Leave messages unreceived (do not call this) while the trainer's queue is full: that is the
        back-pressure the rollout ranks see as sends that stay pending.

        Returns:
            [(rollout rank, trajectories)] in arrival order per rank.
        """
        if self._handshake is not None and time.monotonic() >= self._next_join_check:
            self._accept_waiting()
            self._next_join_check = time.monotonic() + 0.5
        self._sends.progress()
        out: list[tuple[int, list[Trajectory]]] = []
        for comm, peers in self._by_comm():
            while len(out) < max_messages:
                got = _recv(comm, _mpi().ANY_SOURCE, _mpi().ANY_TAG)
                if got is None:
                    break
                source, tag, buf = got
                if tag == TAG_HELLO:  # MPMD only: a rank that joined after `world` returned
                    self._welcome(_Peer(comm, source, int(buf[0])))
                    continue
                peer = peers.get(source)
                if peer is None:
                    raise RuntimeError(f"message with tag {tag} from unknown rank {source}")
                if tag == TAG_TRAJ:
                    out.append((peer.rollout_rank, codec.decode(buf)))
                elif tag == TAG_BYE:
                    self._sends.isend(comm, np.array([peer.rollout_rank], np.int64), source, TAG_BYE)
                    peer.closed = True
                    if self._handshake is not None:  # port mode: the intercomm was this peer's alone
                        self._sends.drain(10.0, self.poll_s, f"rollout rank {peer.rollout_rank}")
                        comm.Disconnect()
                        break
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
        """Tell every rollout rank to stop, and wait for their byes.

        Returns:
            Trajectories that arrived meanwhile (also in the shards; the caller decides).

        Raises:
            TimeoutError: naming the rollout ranks that did not say bye within `timeout_s`.
        """
        self.notify(self.version, stop=True)
        late: list[Trajectory] = []
        deadline = time.monotonic() + timeout_s
        while self.open_ranks:
            late += [t for _, batch in self.poll() for t in batch]
            if time.monotonic() > deadline:
                raise TimeoutError(f"trainer waited {timeout_s:g} s for rollout ranks {self.open_ranks} to close")
            time.sleep(self.poll_s)
        self._sends.drain(timeout_s, self.poll_s, "rollout ranks")
        if self._handshake is not None:
            self._handshake.close()
        return late


class RolloutChannel(NoticeInbox):
    """One rollout rank's end: sends trajectories to the trainer and receives its notices (polling them
    also drives the pending sends)."""

    def __init__(self, comm: Any, trainer: int, rollout_rank: int, poll_s: float, max_pending: int,
                 port_mode: bool) -> None:
        self.comm, self.trainer, self.rollout_rank = comm, trainer, rollout_rank
        self.poll_s, self.max_pending, self._port_mode = poll_s, max_pending, port_mode
        self._sends = _Sends()
        self._notices: list[Notice] = []
        self.version = -1
        self.stopped = False

    @classmethod
    def world(cls, rollout_rank: int, *, trainer: int = 0, timeout_s: float = 120.0, poll_s: float = 0.002,
              max_pending: int = 8, comm: Any = None) -> RolloutChannel:
        """Say hello to the trainer's world rank `trainer` and wait for its first notice.

        Raises:
            TimeoutError: naming the trainer rank when it does not answer within `timeout_s`.
        """
        comm = _mpi().COMM_WORLD if comm is None else comm
        ch = cls(comm, trainer, rollout_rank, poll_s, max_pending, port_mode=False)
        ch._hello(timeout_s, f"trainer (world rank {trainer})")
        return ch

    @classmethod
    def connect(cls, run_dir: str | os.PathLike[str], rollout_rank: int, read: Read, *, timeout_s: float = 120.0,
                poll_s: float = 0.002, max_pending: int = 8) -> RolloutChannel:
        """Join the trainer whose MPI port is in `run_dir/rendezvous.json`, and wait for its first notice.

        Args:
            read: `agentrl.launch.rendezvous.read`, which returns rendezvous.json as a dict.

        Raises:
            TimeoutError: naming the trainer when it publishes no port, or does not answer, in `timeout_s`.
        """
        deadline = time.monotonic() + timeout_s
        inter = _Handshake.connect(Path(run_dir), rollout_rank, read, timeout_s)
        ch = cls(inter, 0, rollout_rank, poll_s, max_pending, port_mode=True)
        ch._hello(max(deadline - time.monotonic(), 1.0), f"trainer (port in {run_dir}/rendezvous.json)")
        return ch

    def _hello(self, timeout_s: float, who: str) -> None:
        if not self._port_mode:  # in port mode the accepted connection is the hello
            self._sends.isend(self.comm, np.array([self.rollout_rank], np.int64), self.trainer, TAG_HELLO)
        deadline = time.monotonic() + timeout_s
        while self.wait_notice(0.0) is None:  # the welcome: `version` is the trainer's now
            if time.monotonic() > deadline:
                raise TimeoutError(f"rollout rank {self.rollout_rank} waited {timeout_s:g} s for the {who}")
            time.sleep(self.poll_s)

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
        """Finish outstanding sends, say bye, and wait for the trainer's answer (then disconnect).

        Raises:
            TimeoutError: the trainer did not receive the sends or answer the bye within `timeout_s`.
        """
        self._sends.drain(timeout_s, self.poll_s, "the trainer")
        self._sends.isend(self.comm, np.array([self.rollout_rank], np.int64), self.trainer, TAG_BYE)
        deadline = time.monotonic() + timeout_s
        while _recv(self.comm, self.trainer, TAG_BYE) is None:
            self._pull()  # notices sent before the answer arrive first: keep them for poll_notices
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"rollout rank {self.rollout_rank}: the trainer did not answer bye in {timeout_s:g} s")
            time.sleep(self.poll_s)
        self._pull()  # in case a notice sent before the answer is matched only now
        self._sends.drain(timeout_s, self.poll_s, "the trainer")
        if self._port_mode:
            self.comm.Disconnect()


class _Handshake:
    """Port mode's file handshake in `run_dir/mpi/`, so that nobody blocks in MPI for long.

    trainer: Open_port; publish {port, nonce} as rendezvous `mpi_port`; per request, answer and Accept.
    rollout r: read `mpi_port`; write `request-r.json` {nonce, token}; wait for `accept-r.json` echoing
    both; Connect. A request naming another nonce (a dead trainer's port) is answered with nothing: the
    rollout rank re-reads rendezvous.json and asks again until its timeout.
    """

    poll_s = 0.02

    def __init__(self, run_dir: Path, port: str, nonce: str) -> None:
        self.run_dir, self.port, self.nonce = run_dir, port, nonce
        self.dir = run_dir / "mpi"

    @classmethod
    def open(cls, run_dir: Path, publish: Publish) -> _Handshake:
        MPI = _mpi()
        h = cls(run_dir, MPI.Open_port(), secrets.token_hex(8))
        h.dir.mkdir(parents=True, exist_ok=True)
        for stale in h.dir.glob("accept-*.json"):
            stale.unlink(missing_ok=True)
        publish(run_dir, **{PORT_KEY: {"port": h.port, "nonce": h.nonce, "host": socket.gethostname(),
                                                  "pid": os.getpid()}})
        return h

    def requests(self) -> list[tuple[int, dict[str, Any]]]:
        out = []
        for path in sorted(self.dir.glob("request-*.json")):
            try:
                req = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # being replaced: next round
            path.unlink(missing_ok=True)
            if req.get("nonce") == self.nonce:
                out.append((int(req["rollout_rank"]), req))
        return out

    def accept(self, rollout_rank: int, request: dict[str, Any]) -> Any:
        _write_json(self.dir / f"accept-{rollout_rank}.json", {"nonce": self.nonce, "token": request["token"]})
        return _mpi().COMM_SELF.Accept(self.port)

    def close(self) -> None:
        _mpi().Close_port(self.port)

    @classmethod
    def connect(cls, run_dir: Path, rollout_rank: int, read: Read, timeout_s: float) -> Any:
        directory, token = run_dir / "mpi", secrets.token_hex(8)
        answer = directory / f"accept-{rollout_rank}.json"
        deadline, asked = time.monotonic() + timeout_s, None
        while True:
            try:
                entry = read(run_dir).get(PORT_KEY)
            except (OSError, ValueError):
                entry = None
            if entry and entry["nonce"] != asked and directory.is_dir():
                _write_json(directory / f"request-{rollout_rank}.json",
                            {"nonce": entry["nonce"], "token": token, "rollout_rank": rollout_rank, "pid": os.getpid()})
                asked = entry["nonce"]
            try:
                got = json.loads(answer.read_text())
            except (OSError, ValueError):
                got = None
            if got and entry and got == {"nonce": entry["nonce"], "token": token}:
                answer.unlink(missing_ok=True)
                return _mpi().COMM_SELF.Connect(entry["port"])
            if time.monotonic() > deadline:
                state = "published no MPI port" if not entry else "did not answer the connect request"
                raise TimeoutError(f"rollout rank {rollout_rank} waited {timeout_s:g} s for the trainer: it {state} "
                                   f"({run_dir}/rendezvous.json key {PORT_KEY!r}, {directory})")
            time.sleep(cls.poll_s)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    write_json_atomic(path, data, durable=False)
