"""`transport.inflight=abort` end to end (slow: about two minutes): on new weights the running episodes are
cancelled and started again, so no trajectory mixes versions, and the restarts are counted."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.transport.shards import ShardReader, rank_dirs

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_abort_restarts_episodes_on_the_new_weights(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.train", "--preset", "smoke", f"run_root={tmp_path}", "cluster.schedule=async",
         "transport.inflight=abort", "algo.max_staleness=2", "trainer.steps=3", "rollout.env_latency_s=0.3",
         "rollout.eval_sampled=0", "cluster.role_timeout_s=400"],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    run_dir = tmp_path / "smoke"
    trajs = [t for _, d in rank_dirs(run_dir, "rollout").items() for _, ts in ShardReader(d).scan() for t in ts]
    assert trajs
    for t in trajs:
        assert len(set(t.policy_version[t.loss_mask == 1].tolist())) == 1, t.traj_id  # never two versions
    rollout = json.loads((run_dir / "report" / "rollout-0.json").read_text())
    assert rollout["aborted"] > 0  # episodes were running when weights changed, and were restarted
    ledger = json.loads((run_dir / "report" / "ledger.json").read_text())
    seen = set(ledger["consumed"]) | set(ledger["excluded"]) | set(ledger["held_at_end"])
    assert seen == {t.traj_id for t in trajs}
