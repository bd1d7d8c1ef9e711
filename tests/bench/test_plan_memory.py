"""`python -m jobs.plan_pipeline --memory`: the trainer's memory per rank for every preset, and a setting that does
not fit is called so."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jobs.plan_pipeline", "--memory", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def test_every_preset_fits_and_a_setting_that_does_not_is_named() -> None:
    run = _plan("--json")
    assert run.returncode == 0, run.stderr
    rows = {r["name"]: r for r in json.loads(run.stdout)}
    assert set(rows) == {f"agentbench-qwen2.5-{s}" for s in ("3b", "7b", "14b", "32b")}
    assert all(r["fits"] and r["gpu_gib"] == 80 for r in rows.values())
    assert rows["agentbench-qwen2.5-7b"]["setup"]["ranks"] == 16
    off = _plan("agentbench-qwen2.5-3b", "--set", "trainer.activation_checkpointing=false")
    assert off.returncode == 0 and "agentbench-qwen2.5-3b" in off.stdout
    assert off.stdout.strip().splitlines()[-1].endswith("NO")
