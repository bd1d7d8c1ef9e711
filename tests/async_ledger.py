"""Reconciling an asynchronous run's ledger with its shards (imported by name, as `system_tools`): used by the
local end-to-end run (tests/e2e) and by the Slurm runs (tests/launch), requeued or not."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from agentrl.transport.shards import ShardReader, rank_dirs
from agentrl.types import Trajectory


def shard_trajectories(run_dir: Path) -> dict[int, list[Trajectory]]:
    """Every trajectory the rollout ranks wrote, by rollout rank."""
    return {r: [t for _, ts in ShardReader(d).scan() for t in ts] for r, d in rank_dirs(run_dir, "rollout").items()}


@dataclass(frozen=True)
class Ledger:
    consumed: set[str]
    excluded: dict[str, str]
    """id → reason"""
    held: set[str]
    written: list[str]
    """Every trajectory id in the shards, in shard order."""


def reconcile(run_dir: Path) -> Ledger:
    """Assert that report/ledger.json accounts for every trajectory in the shards exactly once (consumed,
    excluded with a reason, or held when the run ended), and that the shards hold each id once."""
    written = [t.traj_id for ts in shard_trajectories(run_dir).values() for t in ts]
    assert written, f"no trajectories in {run_dir}/shards/rollout-*"
    dup = sorted({i for i in written if written.count(i) > 1})
    assert not dup, f"written more than once: {dup[:10]}"
    body = json.loads((run_dir / "report" / "ledger.json").read_text())
    consumed, excluded, held = set(body["consumed"]), set(body["excluded"]), set(body["held_at_end"])
    assert len(consumed) == len(body["consumed"]), "an id consumed twice"
    assert not (consumed & excluded) and not (consumed & held) and not (excluded & held)
    assert consumed | excluded | held == set(written), (  # nothing lost silently, nothing invented
        f"in the shards only: {sorted(set(written) - consumed - excluded - held)[:10]}; "
        f"in the ledger only: {sorted((consumed | excluded | held) - set(written))[:10]}")
    return Ledger(consumed, dict(body["excluded"]), held, written)
