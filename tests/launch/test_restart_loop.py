"""The rendered scripts' env-worker restart loop, run by bash against a fake `srun` (no Slurm needed): a worker
whose step fails is started again at most `cluster.max_restarts` times, each worker on its own; SIGTERM to the
supervisor stops every worker's step."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.launch import sbatch, topology

# srun stand-in: records its arguments; task "worker-N" fails its first FAILS_N calls, then exits 0, or
# (SLEEP=1) sleeps until it is signalled, recording the signal
FAKE_SRUN = """#!/bin/bash
log=$CALLS/calls; echo "$*" >> "$log"
all="$*"; id=${all##*--worker-id }; id=${id%% *}
n=$(grep -c -- "--worker-id $id\\b" "$log")
fails_var=FAILS_${id#worker-}; fails=${!fails_var:-0}
if [ "${SLEEP:-0}" = 1 ]; then trap 'echo "$id TERM" >> "$CALLS/signals"; kill $! 2>/dev/null; exit 0' TERM; sleep 30 & wait; exit 0; fi
[ "$n" -le "$fails" ] && exit 3
exit 0
"""


def supervisor(max_restarts: int, workers: int) -> str:
    """The env-worker functions of the rendered smoke script, then `env_workers N`."""
    cfg = load_config("smoke", [f"cluster.max_restarts={max_restarts}", f"envs.workers={workers}"])
    text = sbatch.render_hetjob(topology.plan(cfg), "smoke", [])
    start, end = text.index("env_worker() {"), text.index("\n}\n", text.index("env_workers() {")) + 3
    return 'PY=python RUN_DIR=/run\n' + text[start:end] + f"env_workers {workers}\n"


def run(script: str, tmp_path: Path, **env: str) -> subprocess.Popen:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "srun").write_text(FAKE_SRUN)
    (bindir / "srun").chmod(0o755)
    return subprocess.Popen(["bash", "-c", script], env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}",
                            "CALLS": str(tmp_path), **env}, stdout=subprocess.PIPE, text=True)


def calls(tmp_path: Path, worker: int) -> list[str]:
    path = tmp_path / "calls"
    lines = path.read_text().splitlines() if path.exists() else []
    return [line for line in lines if f"--worker-id worker-{worker}" in line]


def test_a_failed_worker_is_restarted_within_the_bound(tmp_path: Path) -> None:
    proc = run(supervisor(max_restarts=3, workers=2), tmp_path, FAILS_0="2")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert len(calls(tmp_path, 0)) == 3  # failed twice, started again twice, then served to the end
    assert len(calls(tmp_path, 1)) == 1  # its neighbour was left alone
    assert "env_worker 0 exited with 3; starting it again (2 restarts left)" in out
    assert "env_worker 0 exited with 3; starting it again (1 restarts left)" in out
    assert all("--output=/run/logs/env_worker-0.log" in c.split() for c in calls(tmp_path, 0))  # one log each


def test_a_worker_past_the_bound_stays_down(tmp_path: Path) -> None:
    proc = run(supervisor(max_restarts=1, workers=2), tmp_path, FAILS_1="5")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 3  # the supervisor reports the failure it gave up on
    assert len(calls(tmp_path, 1)) == 2  # the first start and one restart, no more
    assert len(calls(tmp_path, 0)) == 1
    assert out.count("starting it again") == 1


def test_sigterm_stops_every_worker_step(tmp_path: Path) -> None:
    proc = run(supervisor(max_restarts=3, workers=3), tmp_path, SLEEP="1")
    try:
        deadline = time.monotonic() + 20
        while sum(len(calls(tmp_path, w)) for w in range(3)) < 3:
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.1)
        time.sleep(0.3)  # their TERM traps are set
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert sorted((tmp_path / "signals").read_text().split("\n")[:-1]) == [f"worker-{w} TERM" for w in range(3)]
    assert all(len(calls(tmp_path, w)) == 1 for w in range(3))  # stopped, not restarted


@pytest.mark.parametrize("restarts", [0])
def test_no_restarts_keeps_one_step_for_every_worker(restarts: int) -> None:
    cfg = load_config("smoke", [f"cluster.max_restarts={restarts}", "envs.workers=3"])
    text = sbatch.render_hetjob(topology.plan(cfg), "smoke", [])
    assert "env_workers" not in text and "--ntasks=3 --exact" in text
