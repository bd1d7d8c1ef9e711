"""The asynchronous pipeline with a data-parallel trainer end to end: `python -m jobs.train --preset smoke
cluster.schedule=async cluster.trainer.ranks_per_node=2 cluster.rollout.ranks=1 trainer.parallel=ddp`, two
trainer ranks (DDP over gloo, their process group made from MPI) and one rollout rank in one mpiexec world,
real vLLM, real env workers. About two minutes on 2 cores.

Checked: the run finishes with its summary; the ledger accounts for every trajectory in the shards exactly
once; both trainer ranks trained (their lines are in the log; the final checkpoint is a 2-rank one) and the
steps changed the published weights."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from async_ledger import reconcile

from agentrl.transport import weights

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e
STEPS = 2  # the smoke preset's


def test_two_trainer_ranks_run_the_pipeline_and_account_for_every_trajectory(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.train", "--preset", "smoke", f"run_root={tmp_path}", "cluster.schedule=async",
         "cluster.trainer.ranks_per_node=2", "cluster.rollout.ranks=1", "trainer.parallel=ddp", "trainer.threads=1",
         "rollout.eval_sampled=0", "cluster.role_timeout_s=300"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "summary: held-out success" in proc.stdout
    run_dir = tmp_path / "smoke"
    ledger = reconcile(run_dir)
    trainer = json.loads((run_dir / "report" / "trainer.json").read_text())
    assert trainer["steps_done"] == STEPS and trainer["schedule"] == "async"
    assert trainer["trajectories_trained"] == len(ledger.consumed) == STEPS * 2 * 4  # smoke keeps every group
    assert trainer["rl_steps"] == STEPS and trainer["sft_steps"] > 0
    final = run_dir / "ckpt" / f"step-{STEPS}"
    assert json.loads((final / "trainer.json").read_text())["world_size"] == 2
    assert sorted(p.name for p in (final / "state").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    log = (run_dir / "logs" / "pipeline.log").read_text()
    assert "[trainer-1]" in log and "[trainer]" in log and "[rollout-0]" in log
    first, last = (dict(weights.iter_weights(weights.version_dir(run_dir, v))) for v in (0, STEPS))
    assert max(float((last[k] - first[k]).abs().max()) for k in first) > 0
