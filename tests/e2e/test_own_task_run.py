"""A user's own task, by import path, trained end to end through `python -m jobs.train` (real processes):
the controller routes it under the task's own name, and every report and metric names it so."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.transport.shards import ShardReader

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def test_import_path_task_trains_through_the_main_job(tmp_path: Path) -> None:
    spec = "agentrl.tasks.example:GuessTask"
    proc = subprocess.run([sys.executable, "-m", "jobs.train", "--preset", "smoke", f"run_root={tmp_path}",
                           f"envs.tasks=[{spec}]", "rollout.max_turns=0", "rollout.max_new_tokens=24"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = tmp_path / "smoke"
    summary = json.loads((run / "report" / "summary.json").read_text())
    assert list(summary["per_task"]) == ["guess"]
    row = summary["per_task"]["guess"]
    assert row["episodes"] == 8 and sum(row["status"]["after_rl"].values()) == 8
    assert "  guess: greedy" in proc.stdout  # the per-task summary line
    written = [t for _, ts in ShardReader(run / "shards" / "rollout-0").scan() for t in ts]  # segments, as finished
    trajs = [t for t in written if t.oldest_version() == 0]  # the first step's groups
    assert {t.task for t in written} == {"guess"} and len(trajs) == 8
    # no global cap: an episode ends only by guessing right, by the task's own 10 turns, or by the context
    assert {t.status.value for t in trajs} <= {"completed", "turn_limit", "context_limit"}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    assert "rollout/guess/success" in acc.Tags()["scalars"]
