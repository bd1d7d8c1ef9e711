"""`python -m jobs.chaos --quick` in CI: env workers killed by pid while they hold sessions, the trainer
killed once and resumed from its checkpoint (the rollout rank following it); the run completes and every
trajectory is accounted for."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def test_quick_chaos_run_loses_nothing(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    proc = subprocess.run([sys.executable, "-m", "jobs.chaos", "--quick", "--run-root", str(tmp_path),
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["completed"] and r["steps_done"] == 8 and r["rl_steps"] == 8
    killed = [k["role"] for k in r["kills"]]
    assert "trainer" in killed and r["restarts"]["trainer"] == 1  # resumed from its checkpoint
    # killed after step 4: weights/v0 was pruned by then, so the rollout rank restarted after it (its rank
    # follows a restarted trainer) started from the version the trainer resumed at (it once waited for v0)
    trainer_kill = next(k for k in r["kills"] if k["role"] == "trainer")
    assert "v0" not in trainer_kill["weights"] and r["restarts"].get("rollout-0", 0) >= 1
    assert sum(k.startswith("env_worker-") for k in killed) >= 1 and r["sessions_hit"] >= 1
    # every step trained on one step's trajectories (8 prompts x 4 samples; sync: nothing stale, no group left out
    # for lack of members), and every trajectory the rollout produced, the killed trainer's lifetime's included, is
    # consumed once, excluded with a reason or held at the end
    assert r["consumed"] == 8 * 8 * 4 and r["produced"] == r["unique_ids"] >= r["consumed"]
    assert r["consumed"] + sum(r["excluded"].values()) + r["held_at_end"] == r["produced"]
    assert r["lost_unexplained"] == 0
