"""The controller's state: workers, sessions, ended sessions, and the routing rule. No I/O here.

Every operation is a dict lookup or a scan over workers (tens), never over sessions, except the
periodic `expire` sweep: that is what lets one asyncio process hold 10,000 concurrent sessions.
Time is passed in (`now`, monotonic seconds) so the rules are testable without sleeping.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentrl.serving.wire_types import EnvError, shown
from agentrl.types import Status

MAX_TOMBSTONES = 200_000
"""Ended sessions remembered so their late calls get a status instead of unknown_session (bounded)."""


@dataclass
class WorkerEntry:
    worker_id: str
    address: str
    tasks: tuple[str, ...]
    slots: int
    last_heartbeat: float
    draining: bool = False
    alive: bool = True
    reported_active: int = 0
    sessions: set[str] = field(default_factory=set)
    pending: int = 0
    """start_sample calls in flight to this worker: counted as taken so concurrent starts spread out."""
    failures: int = 0
    """Consecutive calls that timed out or got a garbage answer; reset by any good answer."""
    unhealthy: dict[str, str] = field(default_factory=dict)
    """Tasks the worker's heartbeats say fail every start there (task -> its last error)."""

    @property
    def free(self) -> int:
        return self.slots - len(self.sessions) - self.pending

    def to_wire(self) -> dict[str, Any]:
        return {"worker_id": self.worker_id, "address": self.address, "tasks": list(self.tasks),
                "slots": self.slots, "active": len(self.sessions), "free": max(0, self.free),
                "reported_active": self.reported_active, "draining": self.draining, "alive": self.alive,
                "failures": self.failures, "unhealthy": dict(self.unhealthy)}


@dataclass
class SessionEntry:
    session_id: str
    task: str
    worker_id: str
    last_used: float


@dataclass(frozen=True)
class Ended:
    """Why a session ended without its client asking (dead worker, idle expiry)."""

    status: Status
    reason: str
    at: float
    cause: str = "env_error"
    """The failure class it is counted under in /status (worker_died, idle_expired, worker_timeout, ...)."""


class Registry:
    def __init__(self) -> None:
        self.workers: dict[str, WorkerEntry] = {}
        self.sessions: dict[str, SessionEntry] = {}
        self.tombstones: OrderedDict[str, Ended] = OrderedDict()
        self.ended_by: dict[str, int] = {}
        """Live sessions ended as env_error, by cause: a session ends once, so it is counted once."""

    # ------------------------------------------------------------------------------------ workers
    def register(self, worker_id: str, address: str, tasks: list[str], slots: int,
                 sessions: list[tuple[str, str]], now: float, draining: bool = False) -> list[str]:
        """Add or refresh a worker. `sessions` are (session_id, task) the worker still holds.

        Returns the session ids the worker should drop: those already ended here (e.g. while it was
        thought dead). Sessions it held before and no longer lists (a restarted worker) end as env_error;
        sessions it lists that we do not know (a restarted controller) are adopted.
        """
        old = self.workers.get(worker_id)
        listed = {sid for sid, _ in sessions}
        if old is not None:
            for sid in list(old.sessions - listed):
                self.end_session(sid, Ended(Status.ENV_ERROR, f"worker {worker_id} restarted", now, "worker_died"))
        entry = WorkerEntry(worker_id=worker_id, address=address.rstrip("/"), tasks=tuple(tasks), slots=slots,
                            last_heartbeat=now, draining=draining)
        self.workers[worker_id] = entry
        drop = []
        for sid, task in sessions:
            if sid in self.tombstones:
                drop.append(sid)
            elif sid not in self.sessions or self.sessions[sid].worker_id == worker_id:
                self.add_session(sid, task, worker_id, now)
        return drop

    def heartbeat(self, worker_id: str, active: int, draining: bool, now: float,
                  unhealthy: dict[str, str] | None = None) -> bool:
        """Record a heartbeat; False means "unknown or declared dead: register again".

        Draining only ever turns on here (a drain asked of the controller holds even if a heartbeat
        sent before the worker heard of it arrives later); a worker leaves draining by registering anew.
        """
        entry = self.workers.get(worker_id)
        if entry is None or not entry.alive:
            return False
        entry.last_heartbeat = now
        entry.reported_active = active
        entry.unhealthy = dict(unhealthy or {})
        entry.draining = entry.draining or draining
        return True

    def not_held(self, worker_id: str, session_ids: list[str]) -> list[str]:
        """Of `session_ids` (quiet on that worker), those no live session of that worker is: to drop."""
        return [sid for sid in session_ids
                if (s := self.sessions.get(sid)) is None or s.worker_id != worker_id]

    def touch(self, session_ids: list[str], now: float) -> list[str]:
        """A client's keep-alive: mark its sessions used. Returns the ids that are not live sessions."""
        missing = []
        for sid in session_ids:
            s = self.sessions.get(sid)
            if s is None:
                missing.append(sid)
            else:
                s.last_used = now
        return missing

    def mark_dead(self, worker_id: str, reason: str, now: float) -> list[str]:
        """Declare a worker dead; its sessions end as env_error. Returns their ids."""
        entry = self.workers.get(worker_id)
        if entry is None or not entry.alive:
            return []
        entry.alive = False
        ended = list(entry.sessions)
        for sid in ended:
            self.end_session(sid, Ended(Status.ENV_ERROR, f"worker {worker_id} died: {reason}", now, "worker_died"))
        return ended

    def pick(self, task: str, exclude: frozenset[str] | set[str] = frozenset()) -> WorkerEntry:
        """The live, non-draining worker of `task` with the most free slots; one that reports `task`
        unhealthy (its starts all fail) only when no other has room, and after it a suspect one (its
        last call timed out or came back garbled).

        Raises unknown_task if no registered worker (alive or not) ever served `task`, no_capacity if
        none can take a session now (also when no worker has registered yet: that is a wait, not a typo).
        """
        serving = [w for w in self.workers.values() if task in w.tasks]
        if not serving:
            if self.workers:
                known = sorted({t for w in self.workers.values() for t in w.tasks})
                raise EnvError("unknown_task", f"no worker serves task {shown(task)} (served: {', '.join(known)})")
            raise EnvError("no_capacity", "no env worker has registered yet")
        ready = [w for w in serving if w.alive and not w.draining and w.free > 0 and w.worker_id not in exclude]
        if not ready:
            raise EnvError("no_capacity", f"no live worker of task {shown(task)} has a free slot")
        # ties go to the lowest worker id: deterministic, and all workers fill evenly anyway
        return min(ready, key=lambda w: (task in w.unhealthy, w.failures > 0, -w.free, w.worker_id))

    def any_worker(self, task: str) -> WorkerEntry:
        """A live worker of `task`, full or draining ones included (for read-only calls like indices)."""
        live = [w for w in self.workers.values() if task in w.tasks and w.alive]
        if live:
            return min(live, key=lambda w: w.worker_id)
        self.pick(task)  # raises the right error
        raise EnvError("no_capacity", f"no live worker of task {shown(task)}")  # pragma: no cover

    # ------------------------------------------------------------------------------------ sessions
    def add_session(self, sid: str, task: str, worker_id: str, now: float) -> None:
        self.sessions[sid] = SessionEntry(sid, task, worker_id, now)
        self.workers[worker_id].sessions.add(sid)

    def end_session(self, sid: str, ended: Ended | None = None) -> SessionEntry | None:
        """Forget a session; with `ended`, remember why so its later calls get that status."""
        entry = self.sessions.pop(sid, None)
        if entry is not None:
            worker = self.workers.get(entry.worker_id)
            if worker is not None:
                worker.sessions.discard(sid)
            if ended is not None and ended.status == Status.ENV_ERROR:
                self.ended_by[ended.cause] = self.ended_by.get(ended.cause, 0) + 1
        if ended is not None:
            self.tombstones[sid] = ended
            while len(self.tombstones) > MAX_TOMBSTONES:
                self.tombstones.popitem(last=False)
        return entry

    def excuse(self, seconds: float, now: float) -> None:
        """Time the controller could not listen (its event loop stalled) is nobody's silence: every live worker's
        last heartbeat and every session's last use move `seconds` later (never past `now`)."""
        for w in self.workers.values():
            if w.alive:
                w.last_heartbeat = min(now, w.last_heartbeat + seconds)
        for s in self.sessions.values():
            s.last_used = min(now, s.last_used + seconds)

    def expire(self, now: float, dead_after_s: float, session_idle_s: float,
               tombstone_ttl_s: float, sessions: bool = True) -> tuple[list[str], list[SessionEntry]]:
        """One sweep: workers silent past `dead_after_s` die, sessions idle past `session_idle_s` end.

        `sessions=False` skips the scan over sessions (the caller runs it less often than the worker
        check: it is the one step here that grows with the number of sessions).
        Returns (dead worker ids, expired sessions); the caller ends the expired ones on their workers.
        """
        dead = [w.worker_id for w in self.workers.values() if w.alive and now - w.last_heartbeat > dead_after_s]
        for wid in dead:
            self.mark_dead(wid, f"no heartbeat for {dead_after_s:g}s", now)
        idle = [s for s in self.sessions.values() if now - s.last_used > session_idle_s] if sessions else []
        for s in idle:
            self.end_session(s.session_id, Ended(Status.ENV_ERROR, f"idle for more than {session_idle_s:g}s", now,
                                                 "idle_expired"))
        while self.tombstones:
            sid, ended = next(iter(self.tombstones.items()))
            if now - ended.at <= tombstone_ttl_s:
                break
            del self.tombstones[sid]
        return dead, idle

    def sessions_per_task(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for s in self.sessions.values():
            counts[s.task] = counts.get(s.task, 0) + 1
        return counts


class LatencyStats:
    """Wall time of the last `window` calls to the controller, for /status p50/p99 (milliseconds)."""

    def __init__(self, window: int = 10_000) -> None:
        self.samples: deque[float] = deque(maxlen=window)

    def record(self, ms: float) -> None:
        self.samples.append(ms)

    def summary(self) -> dict[str, float]:
        if not self.samples:
            return {"p50": 0.0, "p99": 0.0, "count": 0}
        arr = np.fromiter(self.samples, dtype=np.float64)
        return {"p50": float(np.percentile(arr, 50)), "p99": float(np.percentile(arr, 99)), "count": len(arr)}
