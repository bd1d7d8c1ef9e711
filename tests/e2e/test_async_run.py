"""The asynchronous pipeline end to end: `python -m jobs.train --preset smoke cluster.schedule=async` with a
trainer and two rollout ranks in one real MPI world (mpich's mpiexec), real vLLM engines, real env workers,
simulated long-tail env latency so that weights change while episodes are mid-trajectory. About two minutes
on 2 cores.

Checked: every trajectory in the shards is accounted for exactly once by the trainer's ledger (consumed,
excluded with a reason, or held when the run ended); every trained one was trained once; per-token versions
are what in-flight swaps produce (constant within a turn, never decreasing, within the staleness bound; a
trajectory spanning a swap carries two versions, which happens when the machine is loaded enough that an
episode is mid-trajectory at a swap: not asserted, see below)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from async_ledger import reconcile, shard_trajectories

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e
STEPS, RANKS, STALENESS = 3, 2, 2


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.train", "--preset", "smoke", f"run_root={root}", "cluster.schedule=async",
         f"cluster.rollout.ranks={RANKS}", f"algo.max_staleness={STALENESS}", f"trainer.steps={STEPS}",
         "rollout.env_latency_s=0.3", "rollout.eval_sampled=0", "cluster.role_timeout_s=400"],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "summary: held-out success" in proc.stdout
    return root / "smoke"


def test_every_trajectory_is_accounted_for_exactly_once(run_dir: Path) -> None:
    by_rank = shard_trajectories(run_dir)
    assert sorted(by_rank) == list(range(RANKS)) and all(by_rank.values())  # both ranks produced
    ledger = reconcile(run_dir)
    consumed, excluded, held = ledger.consumed, ledger.excluded, ledger.held
    trainer = json.loads((run_dir / "report" / "trainer.json").read_text())
    assert trainer["steps_done"] == STEPS and trainer["schedule"] == "async"
    # the smoke preset keeps uniform groups: every consumed trajectory was trained on, once
    assert trainer["trajectories_trained"] == len(consumed) == STEPS * 2 * 4
    assert trainer["left_at_end/held"] == len(held)
    assert trainer["queue"]["consumed"] == len(consumed)
    reasons = Counter(excluded.values())
    assert sum(v for k, v in trainer["queue"].items() if k in reasons) == len(excluded)


def test_per_token_versions_follow_in_flight_swaps(run_dir: Path) -> None:
    consumed = set(json.loads((run_dir / "report" / "ledger.json").read_text())["consumed"])
    multi = 0
    for rank, trajs in shard_trajectories(run_dir).items():
        for t in trajs:
            act = t.loss_mask == 1
            versions = t.policy_version[act]
            assert set(t.engine[act].tolist()) <= {rank}  # the rank's engine sampled every action token
            assert np.all(np.diff(versions) >= 0)  # weights only move forward
            assert np.all(t.policy_version[~act] == -1)
            # a turn is one generation call: one version per contiguous run of action tokens
            edges = np.flatnonzero(np.diff(act.astype(np.int8)) != 0) + 1
            for seg_v, seg_a in zip(np.split(t.policy_version, edges), np.split(act, edges)):
                if seg_a.all():
                    assert len(set(seg_v.tolist())) == 1
            multi += len(set(versions.tolist())) > 1
    # staleness of what was trained never exceeded the bound (the trainer logged it per step)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    assert max(e.value for e in acc.Scalars("pipeline/staleness_max")) <= STALENESS
    for tag in ("pipeline/queue_depth", "pipeline/staleness_mean", "pipeline/trainer_idle_frac", "train/loss"):
        assert len(acc.Scalars(tag)) == STEPS, tag
    assert consumed
    # Whether some episode is mid-trajectory when new weights arrive depends on the machine's load (seen: 0 to
    # a few per run here), so a trajectory carrying two versions is reported, not required; when there is one,
    # the checks above hold for it (one version per turn, never decreasing).
    print(f"trajectories spanning a weight swap: {multi}")


def test_rollout_metrics_logged_once_by_the_rollout(run_dir: Path) -> None:
    """Per-task rollout metrics come from the rollout ranks (one series each), not re-logged by the trainer."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = {}
    for events in sorted((run_dir / "tb").glob("events.out.tfevents.*")):  # one file per role, named after it
        acc = EventAccumulator(str(events))
        acc.Reload()
        tags[events.name.rsplit(".", 1)[1]] = set(acc.Tags()["scalars"])
    assert "rollout/lookup/reward" not in tags["trainer"]
    for r in range(RANKS):
        assert {"rollout/lookup/reward", "pipeline/rollout_idle_frac",
                "pipeline/rollout_window_bound_frac"} <= tags[f"rollout-{r}"]
        rep = json.loads((run_dir / "report" / f"rollout-{r}.json").read_text())
        assert 0.0 <= rep["window_bound_frac"] <= 1.0 and 0.0 < rep["in_flight_mean"] <= 16  # the smoke preset runs 16 at once
