"""The asynchronous pipeline's channel without MPI: the shared filesystem carries everything.

For roles that run as separate jobs (their own Slurm jobs, or processes the local launcher restarts one by
one) with no MPI world between them. It keeps the contract of `agentrl.transport.channel` (the protocols
`TrainerChannel` / `RolloutChannel`), with two differences the contract allows: notices are coalesced (a rank
sees the newest version, not every one), and `send` carries nothing (the shard segment is the message).

* **Trajectories**: the shard segments themselves. A rollout rank already writes every batch to
  `shards/rollout-<r>/<seq>.h5` before it "sends" it, so `FileRolloutChannel.send` does nothing; the
  trainer lists each `shards/rollout-*` directory (ranks may appear late) and reads the segments it has
  not read yet, in sequence order, at most every `poll_s`. It starts after the segments present when the
  channel is made (or at positions passed in): a resumed trainer has drained the older ones already
  (`drain_shards`), and the queue drops a trajectory seen twice as a duplicate, so overlap is harmless
  while a gap would lose data. A restarted writer goes on numbering after its highest segment, so the
  reader's per-rank position stays valid across rollout restarts.
* **Notices**: `channel/notice.json` = {nonce, version, stop}, replaced atomically by the trainer.
  Rollout ranks read it at most every `poll_s`; a notice reaches them within that interval plus the
  filesystem's own delay (attribute caching on NFS), the cost of this mode against MPI's microseconds.
* **Lives**: every trainer channel draws a fresh nonce and publishes it in rendezvous.json
  (`CHANNEL_KEY`). A rollout rank joins only a notice file carrying the nonce that rendezvous.json names
  (the launcher removes the key before it restarts the trainer, so a dead trainer's file is never joined),
  and fails when the notice file later names another nonce: the trainer started again, and the rank must
  start again too to follow it (its weights may be ahead of the resumed trainer's). Hello and bye files
  carry the nonce as well; the trainer ignores those of another life.
* **Closing**: the trainer writes stop, then waits (bounded; a timeout is logged, not raised) for every
  rank's `bye-<r>.json`, which a rank writes after its last shard; segments read after a bye is seen
  include all of that rank's data.

The rendezvous functions are passed in (transport does not import launch, docs/architecture.md §2).
Standard library and the shard reader only: no MPI is initialized, nothing happens on import.
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentrl.fsio import write_json_atomic
from agentrl.transport.channel import Notice, PolledInbox, warn_not_closed
from agentrl.transport.shards import SHARD_NAME, rank_dirs, read_shard
from agentrl.types import Trajectory

CHANNEL_KEY = "file_channel"  # rendezvous.json: {"nonce", "host", "pid"} of the trainer's channel
CHANNEL_DIR = "channel"  # run_dir/channel/: notice.json, hello-<r>.json, bye-<r>.json

Publish = Callable[..., None]  # rendezvous.publish(run_dir, **entries)
Read = Callable[[Path], dict[str, Any]]  # rendezvous.read(run_dir)

def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Replace `path` atomically: readers see the old content or the new, never a torn file."""
    write_json_atomic(path, data, durable=False)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _segments(directory: Path) -> list[tuple[int, Path]]:
    """(seq, path) of the complete segments in a shard directory, in order (temp files never match)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted((int(m.group(1)), directory / n) for n in names if (m := SHARD_NAME.match(n)))


def shard_positions(run_dir: str | os.PathLike[str]) -> dict[int, int]:
    """For each rollout rank's shard directory present now: the sequence number of its next segment."""
    out = {}
    for rank, d in rank_dirs(run_dir, "rollout").items():
        segs = _segments(d)
        out[rank] = segs[-1][0] + 1 if segs else 0
    return out


class FileTrainerChannel:
    """The trainer's end (`channel.TrainerChannel`): reads new shard segments of every rollout rank, writes
    the notice file."""

    def __init__(self, run_dir: Path, ranks: int, nonce: str, version: int, poll_s: float,
                 start: dict[int, int]) -> None:
        self.run_dir, self.ranks, self.nonce, self.poll_s = run_dir, ranks, nonce, poll_s
        self.dir = run_dir / CHANNEL_DIR
        self.version = version
        self._stop = False
        self._next = dict(start)  # rank -> next segment to read
        self._next_read = 0.0  # monotonic time before which poll() does not touch the filesystem
        self._joined: set[int] = set()
        self._closed: set[int] = set()

    @classmethod
    def open(cls, run_dir: str | os.PathLike[str], ranks: int, publish: Publish, *, version: int = 0,
             timeout_s: float = 120.0, poll_s: float = 0.05, start: dict[int, int] | None = None
             ) -> FileTrainerChannel:
        """Announce `version` under a fresh nonce and wait until every rollout rank has said hello.

        Args:
            ranks: rollout ranks 0..ranks-1 that must join.
            publish: `agentrl.launch.rendezvous.publish` (the nonce goes to rendezvous.json).
            start: rank -> first segment to read; default: after the segments present now.

        Raises:
            TimeoutError: naming the rollout ranks that did not join within `timeout_s`.
        """
        run_dir = Path(run_dir)
        ch = cls(run_dir, ranks, secrets.token_hex(8), version, poll_s,
                 shard_positions(run_dir) if start is None else start)
        ch.dir.mkdir(parents=True, exist_ok=True)
        ch._write_notice()  # before the nonce is public: a rank that sees the nonce finds its notice
        publish(run_dir, **{CHANNEL_KEY: {"nonce": ch.nonce, "host": socket.gethostname(), "pid": os.getpid()}})
        deadline = time.monotonic() + timeout_s
        while missing := sorted(set(range(ranks)) - ch._peers()[0]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"trainer waited {timeout_s:g} s for rollout ranks {missing} to join "
                                   f"(no hello-<rank>.json with nonce {ch.nonce} in {ch.dir})")
            time.sleep(poll_s)
        return ch

    def _write_notice(self) -> None:
        _write_json(self.dir / "notice.json", {"nonce": self.nonce, "version": self.version, "stop": self._stop})

    def _peers(self) -> tuple[set[int], set[int]]:
        """Ranks that said hello, and bye, in this life of the trainer (files of another nonce ignored)."""
        for r in range(self.ranks):
            for name, seen in (("hello", self._joined), ("bye", self._closed)):
                if r not in seen and (got := _read_json(self.dir / f"{name}-{r}.json")) \
                        and got.get("nonce") == self.nonce:
                    seen.add(r)
        return self._joined, self._closed

    def _read_new(self, max_messages: int) -> list[tuple[int, list[Trajectory]]]:
        out: list[tuple[int, list[Trajectory]]] = []
        for rank, d in rank_dirs(self.run_dir, "rollout").items():
            first = self._next.get(rank, 0)  # a rank seen for the first time: from its first segment
            for seq, path in _segments(d):
                if seq < first:
                    continue
                if len(out) >= max_messages:
                    return out
                out.append((rank, read_shard(path)))
                self._next[rank] = seq + 1
        return out

    def poll(self, max_messages: int = 64) -> list[tuple[int, list[Trajectory]]]:
        """Segments written since the last call (at most `max_messages`), without blocking.

        Touches the filesystem at most every `poll_s` (an empty list in between), except right after a
        call that stopped at `max_messages`. Do not call while the queue is full: the segments stay on disk.

        Returns:
            [(rollout rank, trajectories of one segment)], in sequence order per rank.
        """
        now = time.monotonic()
        if now < self._next_read:
            return []
        self._peers()
        out = self._read_new(max_messages)
        self._next_read = now if len(out) >= max_messages else now + self.poll_s
        return out

    def recv(self, timeout_s: float, max_messages: int = 64) -> list[tuple[int, list[Trajectory]]]:
        """Like `poll`, but waits up to `timeout_s` for a segment."""
        deadline = time.monotonic() + timeout_s
        while not (got := self.poll(max_messages)) and time.monotonic() < deadline:
            time.sleep(min(self.poll_s, max(self._next_read - time.monotonic(), 0.001)))
        return got

    def notify(self, version: int, stop: bool = False) -> None:
        """Publish `Notice(version, stop)` to every rollout rank (one atomic file replace)."""
        self.version = version
        self._stop |= stop
        self._write_notice()

    @property
    def open_ranks(self) -> list[int]:
        """Rollout ranks that joined this life of the trainer and have not said bye."""
        joined, closed = self._peers()
        return sorted(joined - closed)

    def close(self, timeout_s: float = 30.0) -> list[Trajectory]:
        """Tell every rollout rank to stop and wait (at most `timeout_s`) for their byes.

        A rank that does not say bye in time is logged, not raised (the contract of
        `channel.TrainerChannel.close`); whatever that rank wrote until now is read and returned.

        Returns:
            Trajectories of the segments that arrived meanwhile (the caller decides their fate).
        """
        self.notify(self.version, stop=True)
        late: list[Trajectory] = []
        deadline = time.monotonic() + timeout_s
        while True:
            _, closed = self._peers()  # byes first: a read after a bye sees that rank's last segment
            late += [t for _, batch in self._read_new(1 << 30) for t in batch]
            if closed >= set(range(self.ranks)):
                return late
            if time.monotonic() > deadline:
                warn_not_closed("trainer", f"rollout ranks {sorted(set(range(self.ranks)) - closed)}", timeout_s)
                return late
            time.sleep(self.poll_s)


class FileRolloutChannel(PolledInbox):
    """One rollout rank's end (`channel.RolloutChannel`): reads the trainer's notice file; its shards are its
    messages. Notices carry the newest version only (versions in between are skipped); polling raises
    RuntimeError once the notice file belongs to another life of the trainer."""

    def __init__(self, run_dir: Path, rollout_rank: int, nonce: str, poll_s: float) -> None:
        self.run_dir, self.rollout_rank, self.nonce, self.poll_s = run_dir, rollout_rank, nonce, poll_s
        self.dir = run_dir / CHANNEL_DIR
        self.version = -1
        self.stopped = False
        self._notices: list[Notice] = []
        self._next_read = 0.0

    @classmethod
    def connect(cls, run_dir: str | os.PathLike[str], rollout_rank: int, read: Read, *, timeout_s: float = 120.0,
                poll_s: float = 0.05) -> FileRolloutChannel:
        """Join the trainer whose nonce is in `run_dir/rendezvous.json`, once its notice file carries it.

        Args:
            read: `agentrl.launch.rendezvous.read`.

        Raises:
            TimeoutError: naming the trainer (and what was missing) when it is not there in `timeout_s`.
        """
        run_dir = Path(run_dir)
        notice_path = run_dir / CHANNEL_DIR / "notice.json"
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                entry = read(run_dir).get(CHANNEL_KEY)
            except (OSError, ValueError):
                entry = None
            notice = _read_json(notice_path)
            if entry and notice and notice.get("nonce") == entry.get("nonce"):
                break
            if time.monotonic() > deadline:
                why = (f"no {CHANNEL_KEY!r} in {run_dir}/rendezvous.json" if not entry else
                       f"{notice_path} is missing or from another life (nonce {entry.get('nonce')} wanted)")
                raise TimeoutError(f"rollout rank {rollout_rank} waited {timeout_s:g} s for the trainer: {why}")
            time.sleep(poll_s)
        ch = cls(run_dir, rollout_rank, str(entry["nonce"]), poll_s)
        ch.version, ch.stopped = int(notice["version"]), bool(notice["stop"])  # the welcome: not queued
        _write_json(ch.dir / f"hello-{rollout_rank}.json",
                    {"nonce": ch.nonce, "host": socket.gethostname(), "pid": os.getpid()})
        return ch

    def _pull(self) -> None:
        now = time.monotonic()
        if now < self._next_read:
            return
        self._next_read = now + self.poll_s
        got = _read_json(self.dir / "notice.json")
        if got is None:
            return
        if got.get("nonce") != self.nonce:
            raise RuntimeError(f"rollout rank {self.rollout_rank}: the trainer started again (notice nonce "
                               f"{got.get('nonce')}, joined {self.nonce}); this rank must restart to follow it")
        version, stop = int(got["version"]), bool(got["stop"])
        if version > self.version or stop > self.stopped:
            self.version, self.stopped = max(version, self.version), self.stopped or stop
            self._notices.append(Notice(version, stop))

    @property
    def pending(self) -> int:
        return 0

    def send(self, trajectories: Sequence[Trajectory], timeout_s: float = 600.0) -> float:
        """Nothing to do: the caller wrote the shard segment, which is the message. Returns 0 s waited."""
        return 0.0

    def close(self, timeout_s: float = 60.0) -> None:
        """Say bye (after the last segment is written): the trainer reads up to here and stops waiting. Waits
        for nothing: the segments are on disk already."""
        _write_json(self.dir / f"bye-{self.rollout_rank}.json", {"nonce": self.nonce, "pid": os.getpid()})
