"""The local launcher stops every role it started when it is told to stop (SIGTERM, as Slurm or a user
sends it), instead of dying alone and leaving the controller, workers, trainer and rollout running."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def live_processes_mentioning(text: str) -> list[int]:
    """Pids whose command line contains `text` and that are not zombies (PID 1 here reaps late)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state != "Z":
            pids.append(int(entry.name))
    return pids


def test_sigterm_to_the_launcher_stops_every_role(tmp_path: Path) -> None:
    run = tmp_path / "sig"
    proc = subprocess.Popen([sys.executable, "-m", "jobs.train", "--preset", "smoke", "--name", "sig",
                             f"run_root={tmp_path}", "rollout.engine=expert", "trainer.steps=100000"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 300
        # RL steps under way (weights beyond v0; older versions are pruned, so any of them will do)
        while not (run / "logs" / "pipeline.log").exists() or not any(
                p.name != "v0" for p in (run / "weights").glob("v*")):
            assert proc.poll() is None and time.monotonic() < deadline, "the run did not get going"
            time.sleep(0.5)
        roles = live_processes_mentioning(f"--run-dir {run}")
        assert len(roles) >= 4  # controller, env worker, trainer, rollout
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
        assert rc != 0  # stopped, not finished
        gone = time.monotonic() + 30
        while live_processes_mentioning(f"--run-dir {run}") and time.monotonic() < gone:
            time.sleep(0.5)
        assert live_processes_mentioning(f"--run-dir {run}") == []
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in live_processes_mentioning(f"--run-dir {run}"):
            os.kill(pid, signal.SIGKILL)
