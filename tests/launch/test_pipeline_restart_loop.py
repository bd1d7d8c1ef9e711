"""The rendered async script's pipeline restart, run by bash against a fake `srun` and `scontrol` (no Slurm
needed): the script's own tail (from `set +e` to the end) with the real `python -m jobs.launch
--clear-pipeline`. The MPMD step (trainer + rollout ranks) that fails is started again at most
`cluster.max_restarts` times, each time after the pipeline's rendezvous keys were cleared; a step that ends
0 ends the run; after USR1 the job is requeued and the step is not started again."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.launch import rendezvous, sbatch, topology

ROOT = Path(__file__).resolve().parents[2]
ASYNC = ["cluster.schedule=async", "cluster.rollout.ranks=2"]

# srun stand-in. The pipeline step (jobs.trainer): records its call and whether the pipeline's keys
# were in rendezvous.json when it started, publishes them as a trainer would, then fails its first FAILS
# calls with 9 (FINISHED=1: writes report/summary.json first), else exits 0; SLEEP=1: waits for USR1 (then
# exits 7, as a step might after its trainer checkpointed). Any other step (controller, env worker) serves
# until SIGTERM.
FAKE_SRUN = """#!/bin/bash
if [[ "$*" != *jobs.trainer* ]]; then
  trap 'kill $! 2>/dev/null; exit 0' TERM; sleep 60 & wait; exit 0
fi
log=$CALLS/pipeline; echo "$*" >> "$log"; n=$(wc -l < "$log")
if grep -q mpi_port "$RUN_DIR/rendezvous.json" 2>/dev/null; then echo "$n keys" >> "$CALLS/keys"
else echo "$n none" >> "$CALLS/keys"; fi
echo '{"controller_url": "http://ctl", "mpi_port": "port-'"$n"'", "weights_store": {"n": '"$n"'}}' \\
  > "$RUN_DIR/rendezvous.json"
if [ "${SLEEP:-0}" = 1 ]; then
  trap 'echo USR1 >> "$CALLS/signals"; kill $! 2>/dev/null; exit 7' USR1; sleep 60 & wait; exit 0
fi
if [ "$n" -le "${FAILS:-0}" ]; then
  [ "${FINISHED:-0}" = 1 ] && mkdir -p "$RUN_DIR/report" && echo '{}' > "$RUN_DIR/report/summary.json"
  exit 9
fi
exit 0
"""
FAKE_SCONTROL = """#!/bin/bash
echo "$*" >> "$CALLS/scontrol"
"""


def script_tail(max_restarts: int) -> str:
    """The rendered async smoke script from `set +e` on (the steps, the restart loop, the end)."""
    cfg = load_config("smoke", [*ASYNC, f"cluster.max_restarts={max_restarts}"])
    text = sbatch.render_hetjob(topology.plan(cfg), "smoke", ASYNC)
    return text[text.index("set +e"):]


@dataclass
class Script:
    proc: subprocess.Popen
    out_path: Path

    def finish(self, timeout_s: float = 60) -> tuple[int, str]:
        """Wait for bash, then stop what it left in its process group (after a requeue the services' fake
        steps: Slurm would end the job's steps)."""
        try:
            rc = self.proc.wait(timeout=timeout_s)
        finally:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        return rc, self.out_path.read_text()


def start(tmp_path: Path, max_restarts: int, **env: str) -> Script:
    bindir, run_dir = tmp_path / "bin", tmp_path / "run"
    bindir.mkdir()
    (run_dir / "logs").mkdir(parents=True)
    for name, body in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bindir / name).write_text(body)
        (bindir / name).chmod(0o755)
    script = f"set -euo pipefail\nPY={sys.executable} RUN_DIR={run_dir} SLURM_JOB_ID=42\n" + script_tail(max_restarts)
    full_env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "CALLS": str(tmp_path),
                "RUN_DIR": str(run_dir), "PYTHONPATH": str(ROOT), **env}
    out_path = tmp_path / "job.out"
    with open(out_path, "w") as out:
        proc = subprocess.Popen(["bash", "-c", script], env=full_env, cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    return Script(proc, out_path)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("fails", [0, 1, 2])
def test_a_failed_pipeline_is_restarted_within_the_bound(tmp_path: Path, fails: int) -> None:
    rc, out = start(tmp_path, max_restarts=2, FAILS=str(fails)).finish()
    assert rc == 0, out  # the last start ended 0: the run ends as without a failure
    calls = lines(tmp_path / "pipeline")
    assert len(calls) == fails + 1  # restarted exactly `fails` times
    assert all(c.startswith("--mpi=pmi2 --het-group=0") and " : --het-group=1 " in c for c in calls)  # the MPMD step
    # every restart found the dead trainer's keys gone (the first start: none had been published yet)
    assert lines(tmp_path / "keys") == [f"{n} none" for n in range(1, fails + 2)]
    assert out.count("agentrl: the pipeline (trainer and rollout ranks, one MPI world) exited with 9; clearing its "
                     "rendezvous keys and starting it again") == fails
    for left in range(2 - fails, 2):
        assert f"starting it again ({left} restarts left)" in out
    assert out.count("agentrl: cleared the pipeline's rendezvous keys in") == fails
    assert out.count("mpi_port, weights_store") == fails  # what the clearing found: the last life's keys
    # the controller's address is not the pipeline's: it stays
    assert json.loads((tmp_path / "run" / "rendezvous.json").read_text())["controller_url"] == "http://ctl"
    assert not (tmp_path / "scontrol").exists()  # no requeue


def test_a_pipeline_past_the_bound_ends_the_job_with_its_status(tmp_path: Path) -> None:
    rc, out = start(tmp_path, max_restarts=2, FAILS="5").finish()
    assert rc == 9  # the step's own exit status, after the last allowed restart failed too
    assert len(lines(tmp_path / "pipeline")) == 3  # the first start and two restarts, no more
    assert out.count("starting it again") == 2 and "(0 restarts left)" in out
    assert not (tmp_path / "scontrol").exists()
    # the last life's keys stay where it left them (nothing restarts after it)
    assert rendezvous.read(tmp_path / "run")["mpi_port"] == "port-3"


def test_no_restart_once_the_run_finished(tmp_path: Path) -> None:
    """A step that fails after rollout rank 0 wrote report/summary.json is not started again."""
    rc, out = start(tmp_path, max_restarts=2, FAILS="1", FINISHED="1").finish()
    assert rc == 9 and len(lines(tmp_path / "pipeline")) == 1
    assert "starting it again" not in out


def test_usr1_requeues_and_does_not_restart(tmp_path: Path) -> None:
    script = start(tmp_path, max_restarts=2, SLEEP="1")
    try:
        deadline = time.monotonic() + 20
        while not lines(tmp_path / "pipeline"):
            assert time.monotonic() < deadline, "the pipeline did not start"
            time.sleep(0.1)
        time.sleep(0.5)  # the fake step's USR1 trap is set
        script.proc.send_signal(signal.SIGUSR1)
    finally:
        rc, out = script.finish(timeout_s=30)
    assert rc == 0, out
    assert lines(tmp_path / "signals") == ["USR1"]  # the script passed the warning to the step
    assert "agentrl: USR1, asking the trainer to checkpoint" in out and "agentrl: requeueing job 42" in out
    assert lines(tmp_path / "scontrol") == ["requeue 42"]
    assert len(lines(tmp_path / "pipeline")) == 1  # exited 7 after USR1: requeued, not restarted
    assert "starting it again" not in out and "cleared the pipeline" not in out
    assert rendezvous.read(tmp_path / "run")["mpi_port"] == "port-1"  # --prepare-run drops the file on requeue


def test_no_restarts_renders_the_plain_step() -> None:
    text = script_tail(0)
    assert "wait_pipeline" not in text and "clear-pipeline" not in text
    assert "\nsrun --mpi=pmi2 --het-group=0" in text and 'wait_step "$TRAINER" || status=$?' in text


def test_the_file_channel_has_no_pipeline_loop() -> None:
    cfg = load_config("smoke", [*ASYNC, "transport.channel=files", "cluster.max_restarts=2"])
    text = sbatch.render_hetjob(topology.plan(cfg), "smoke", ASYNC)
    assert "wait_pipeline" not in text and "clear-pipeline" not in text and "\nrollouts 2 &\n" in text
