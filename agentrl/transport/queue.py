"""The trainer's bounded trajectory queue (docs/architecture.md §6): whole GRPO groups, freshness, exactly once.

Trajectories arrive one by one, from any rollout rank, in any order (the MPI channel, or shards drained
after a restart). The queue holds them by `group_id` and releases only complete groups: a group is
complete when it holds `group_size` trainable members. `take(min_groups, max_groups)` returns every
complete group ready now, up to `max_groups` (the dynamic batch), oldest complete first.

Nothing leaves silently. Each trajectory that is not released for training is counted once under one
reason (`EXCLUSION_REASONS`) and its id remembered, so that reconciling the shards against the ledger
accounts for every trajectory:

    env_error, cancelled,  infrastructure outcomes (docs/architecture.md §3; internal_error: our rollout code failed),
    internal_error         never trained on. By default the group shrinks by one (`shrink_on_infra`, as
                           AReaL); otherwise it waits for a retry.
    stale                  trainer version − oldest current-pool action token's version > max_staleness,
                           or − oldest lagging-pool token's > lagging_max_staleness; checked on arrival
                           and again whenever the version advances (`set_version`).
    group_timeout          members of a group still incomplete `group_timeout_s` after its first member
                           arrived; members arriving later for that group are counted the same.
    late                   a member of a group already released to training (a retry that lost a race).
    duplicate              a traj_id seen before (MPI delivery and a shard drain after a restart).
    orphaned               sampled by a version newer than the trainer's: weights published after the
                           checkpoint a restarted trainer resumed from, so that lineage no longer exists.

Bounded: the caller stops receiving while `full`, which leaves data in MPI and the shards: back-pressure,
not loss. `put` itself never refuses, so the overshoot is one receive. `full` counts only the members of
complete groups (`ready_depth` ≥ capacity): then `take` can always release a batch, so back-pressure never
deadlocks. Counting incomplete groups too would: with more episodes in flight than `capacity`, the queue
can fill with members of groups none of which is complete, whose missing members wait unreceived behind
the back-pressure until `group_timeout_s` drops them all. Incomplete groups are bounded by the rollout
instead: each has members still running (the ranks' `rollout.concurrency`) or times out.
Not thread-safe: one trainer loop owns it. Pure Python: no MPI, no torch.
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from agentrl.algorithms.staleness import is_stale
from agentrl.types import Status, Trajectory

EXCLUSION_REASONS = ("stale", "env_error", "cancelled", "internal_error", "group_timeout", "late", "orphaned",
                     "duplicate")


@dataclass
class _Group:
    first_seen: float
    expected: int
    members: list[Trajectory] = field(default_factory=list)


class TrajectoryQueue:
    """Complete, fresh, never-seen-before GRPO groups for the trainer.

    Args:
        group_size: members per group (`rollout.group_size`).
        capacity: trajectories in complete groups at which `full` turns true (>= group_size).
        max_staleness: versions a trajectory's oldest action token of the current pool may lag; None
            disables the filter.
        lagging_max_staleness: the same for tokens of the lagging pool (cross-policy sampling), which are
            old on purpose: `max_staleness` plus the pool's refresh interval K. None: `max_staleness`.
        group_timeout_s: an incomplete group is dropped this long after its first member arrived.
        shrink_on_infra: an env_error/cancelled member shrinks its group by one (True) or the group
            waits for a retried member under a new traj_id (False).
        version: the trainer's policy version now.
        clock: seconds, monotonic (a test passes a fake one).
    """

    def __init__(self, group_size: int, capacity: int, max_staleness: int | None, group_timeout_s: float,
                 shrink_on_infra: bool = True, version: int = 0,
                 clock: Callable[[], float] = time.monotonic, lagging_max_staleness: int | None = None) -> None:
        if group_size < 1 or capacity < group_size:
            raise ValueError(f"need group_size >= 1 and capacity >= group_size, got {group_size}, {capacity}")
        self.group_size, self.capacity, self.max_staleness = group_size, capacity, max_staleness
        self.lagging_max_staleness = max_staleness if lagging_max_staleness is None else lagging_max_staleness
        self.group_timeout_s, self.shrink_on_infra, self.version = group_timeout_s, shrink_on_infra, version
        self.clock = clock
        self._groups: dict[str, _Group] = {}  # incomplete and complete, insertion order
        self._ready: dict[str, None] = {}  # complete group ids, in completion order
        self._closed: dict[str, str] = {}  # group id → "released" | "group_timeout"
        self._consumed: set[str] = set()  # traj ids released to training
        self._excluded: dict[str, str] = {}  # traj id → reason
        self._shrunk: set[str] = set()  # excluded ids whose group has shrunk for them (not checkpointed)
        self._shrinking = {"stale", "orphaned",
                           *(("env_error", "cancelled", "internal_error") if shrink_on_infra else ())}
        self.counts: Counter[str] = Counter()  # reasons, plus "accepted" and "consumed"

    # -- arrival -------------------------------------------------------------------------------------
    def put(self, traj: Trajectory) -> str | None:
        """Hold one trajectory; returns None if held, else the reason it was excluded (and counted)."""
        tid = traj.traj_id
        if tid in self._consumed or tid in self._excluded or self._held(traj):
            if tid in self._excluded and tid not in self._shrunk and traj.group_id not in self._closed \
                    and self._excluded[tid] in self._shrinking:  # restored ledger: its group shrinks again
                self._shrunk.add(tid)
                self._shrink(traj.group_id, 1)
            self.counts["duplicate"] += 1  # the first copy is already accounted for: not in the ledger
            return "duplicate"
        closed = self._closed.get(traj.group_id)
        if closed is not None:
            return self._exclude(traj, "late" if closed == "released" else closed)
        if traj.group_id in self._ready:  # complete already: a retry whose original also arrived
            return self._exclude(traj, "late")
        if traj.status.is_infra:
            if self.shrink_on_infra:
                self._shrunk.add(tid)
                self._shrink(traj.group_id, 1)
            return self._exclude(traj, Status(traj.status).value)
        if traj.newest_version() > self.version:
            self._shrunk.add(tid)
            self._shrink(traj.group_id, 1)
            return self._exclude(traj, "orphaned")
        if self._stale(traj, self.version):
            self._shrunk.add(tid)
            self._shrink(traj.group_id, 1)  # its siblings are as old: waiting for a replacement is futile
            return self._exclude(traj, "stale")
        g = self._group(traj.group_id)
        g.members.append(traj)
        self.counts["accepted"] += 1
        self._check_complete(traj.group_id, g)
        return None

    def put_many(self, trajs: Iterable[Trajectory]) -> Counter[str]:
        """`put` each; returns how many were excluded, by reason."""
        return Counter(r for t in trajs if (r := self.put(t)) is not None)

    def _stale(self, traj: Trajectory, version: int) -> bool:
        if self.max_staleness is None:
            return False
        return is_stale(traj, version, self.max_staleness, self.lagging_max_staleness)

    def _held(self, traj: Trajectory) -> bool:
        g = self._groups.get(traj.group_id)
        return g is not None and any(m.traj_id == traj.traj_id for m in g.members)

    def _group(self, group_id: str) -> _Group:
        if group_id not in self._groups:
            self._groups[group_id] = _Group(self.clock(), self.group_size)
        return self._groups[group_id]

    def _shrink(self, group_id: str, n: int) -> None:
        g = self._group(group_id)
        g.expected -= n
        self._check_complete(group_id, g)

    def _check_complete(self, group_id: str, g: _Group) -> None:
        if g.expected <= 0 and not g.members:  # every member excluded: nothing to train
            del self._groups[group_id]
            self._ready.pop(group_id, None)
            self._closed[group_id] = "released"
        elif len(g.members) >= g.expected:
            self._ready[group_id] = None

    def _exclude(self, traj: Trajectory, reason: str) -> str:
        self._excluded[traj.traj_id] = reason
        self.counts[reason] += 1
        return reason

    # -- version, timeouts, release ------------------------------------------------------------------
    def set_version(self, version: int) -> int:
        """The trainer moved to `version`: drop held members now too stale; returns how many."""
        self.version = version
        if self.max_staleness is None:
            return 0
        dropped = 0
        for gid, g in list(self._groups.items()):
            stale = [t for t in g.members if self._stale(t, version)]
            if not stale:
                continue
            for t in stale:
                self._exclude(t, "stale")
                self._shrunk.add(t.traj_id)
            g.members = [t for t in g.members if not self._stale(t, version)]
            dropped += len(stale)
            self._shrink(gid, len(stale))  # the rest stays a (smaller) group; complete if it was
        return dropped

    def expire(self) -> int:
        """Drop incomplete groups older than `group_timeout_s` (members counted group_timeout)."""
        now, dropped = self.clock(), 0
        for gid, g in list(self._groups.items()):
            if gid not in self._ready and now - g.first_seen > self.group_timeout_s:
                for t in g.members:
                    self._exclude(t, "group_timeout")
                dropped += len(g.members)
                del self._groups[gid]
                self._closed[gid] = "group_timeout"
        return dropped

    def take(self, min_groups: int, max_groups: int) -> list[list[Trajectory]]:
        """Up to `max_groups` complete groups, oldest complete first, or [] if fewer than `min_groups`.

        Expires timed-out groups first. Released trajectories enter the consumed ledger.
        """
        self.expire()
        if len(self._ready) < max(min_groups, 1):
            return []
        out = []
        for gid in list(self._ready)[:max_groups]:
            del self._ready[gid]
            g = self._groups.pop(gid)
            self._closed[gid] = "released"
            self._consumed.update(t.traj_id for t in g.members)
            self.counts["consumed"] += len(g.members)
            out.append(g.members)
        return out

    # -- metrics and checkpoint ----------------------------------------------------------------------
    @property
    def depth(self) -> int:
        """Trajectories held, in complete and incomplete groups."""
        return sum(len(g.members) for g in self._groups.values())

    def held_ids(self) -> list[str]:
        """Ids of the trajectories held now (complete and incomplete groups): neither consumed nor excluded."""
        return [t.traj_id for g in self._groups.values() for t in g.members]

    @property
    def ready_depth(self) -> int:
        """Trajectories in complete groups (what `full` and `free` count)."""
        return sum(len(self._groups[gid].members) for gid in self._ready)

    @property
    def ready_groups(self) -> int:
        return len(self._ready)

    @property
    def full(self) -> bool:
        return self.ready_depth >= self.capacity

    @property
    def free(self) -> int:
        return max(self.capacity - self.ready_depth, 0)

    def metrics(self) -> dict[str, float]:
        """Stable TensorBoard names (docs/architecture.md §9): depth, ready groups, and cumulative counts by reason."""
        out = {"pipeline/queue_depth": float(self.depth), "pipeline/queue_ready_groups": float(self.ready_groups)}
        out.update({f"pipeline/excluded/{r}": float(self.counts[r]) for r in EXCLUSION_REASONS})
        out["pipeline/consumed"] = float(self.counts["consumed"])
        return out

    def state_dict(self) -> dict[str, Any]:
        """The ledger to checkpoint with the trainer. Held trajectories are not in it: after a restart
        they are drained again from the shards, and their ids are not yet in the ledger."""
        counts = dict(self.counts)
        counts["accepted"] = counts.get("accepted", 0) - self.depth  # held ones are accepted again on drain
        return {"consumed": sorted(self._consumed), "excluded": dict(self._excluded),
                "closed": dict(self._closed), "counts": counts, "version": self.version}

    def mark_consumed(self, ids: Iterable[str]) -> None:
        """Ids released to training by an earlier life whose full ledger is gone: repeats of them are dropped
        as duplicates, and they count as consumed."""
        new = set(ids) - self._consumed
        self._consumed |= new
        self.counts["consumed"] += len(new)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._consumed = set(state["consumed"])
        self._excluded = dict(state["excluded"])
        self._closed = dict(state["closed"])
        self.counts = Counter(state["counts"])
        self.version = int(state["version"])
