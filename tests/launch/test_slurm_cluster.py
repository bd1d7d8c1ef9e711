"""Against a real Slurm (the CI's: three node names on one host, .ci/slurm/start.sh), marked `slurm`.

* submitit: the hetjob executor's function runs in group 0 and reaches group 1; the smoke run as one
  three-group job through `jobs.launch`'s submitit path returns its summary from `job.result()`;
* MPI: one MPMD step over two het groups (`srun --mpi=pmi2 --het-group=0 ... : --het-group=1 ...`) is one
  MPI world, and slurm_env places every task in its group (the asynchronous schedule's roles on such a
  step: test_slurm_async.py).
* preemption: USR1 to a running job's batch script → the step checkpoints through agentrl.launch.preempt,
  the script requeues, the job resumes, and the ledger has every id exactly once.
Times on the 2-core machine (shared with other work) are in each test's docstring; all eight: 130-210 s.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_tools import job_gone, sbatch_script, wait_until

from agentrl.config import load_config
from agentrl.launch import sbatch, topology
from agentrl.launch.submit import _Preemptible

pytestmark = [pytest.mark.slurm]
ROOT = Path(__file__).resolve().parents[2]
JOBS = Path(__file__).parent / "slurm_jobs"
SMALL = ["cluster.trainer.slurm.cpus_per_task=1", "cluster.rollout.slurm.cpus_per_task=1",
         "cluster.env.slurm.cpus_per_task=1", "trainer.threads=1", "rollout.engine=expert",
         "cluster.trainer.slurm.time=00:10:00", "cluster.rollout.slurm.time=00:10:00",
         "cluster.env.slurm.time=00:10:00"]


def probe() -> dict:
    """Runs in group 0 of a hetjob (submitit's function); reaches group 1 with srun."""
    out = subprocess.run(
        ["srun", "--het-group=1", sys.executable, "-m", "agentrl.launch.slurm_env", "--", sys.executable, "-c",
         "import os, json; print(json.dumps({k: os.environ[k] for k in ('RANK', 'WORLD_SIZE', 'AGENTRL_HET_GROUP')}))"],
        capture_output=True, text=True, check=True)
    return {"het_size": os.environ["SLURM_HET_SIZE"], "group1": [json.loads(x) for x in out.stdout.splitlines()]}


def test_committed_smoke_script_runs(slurm, job_env, tmp_path: Path) -> None:
    """~15-30 s. `sbatch sbatch/smoke.sbatch` as a person would (submitted from tmp_path, so the run and the
    log land there): three het groups, every role a step, exit 0, the run's summary written."""
    out = subprocess.run(["sbatch", "--parsable", str(ROOT / "sbatch" / "smoke.sbatch")], cwd=tmp_path,
                         capture_output=True, text=True, check=True)
    job = out.stdout.strip()
    wait_until(lambda: job_gone(job), 180, f"job {job} did not finish")
    log = (tmp_path / f"agentrl-smoke-{job}.out").read_text()
    summary = json.loads((tmp_path / "runs" / f"smoke-{job}" / "report" / "summary.json").read_text())
    assert summary["rl_steps"] == 2, log
    state = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state, state


def test_rendered_script_runs_site_setup_from_anywhere(slurm, job_env, tmp_path: Path) -> None:
    """~30 s. The smoke run as `jobs.launch --render-sbatch` renders it by default (root: this checkout, every
    path absolute) with two `cluster.setup` lines, submitted from an unrelated directory: the run lands under
    run_root, the batch shell and every step ran the set-up (each role's log has its marker), exit 0."""
    overrides = [*SMALL, f"run_root={tmp_path / 'runs'}",
                 "cluster.setup=[export AGENTRL_SITE=ok, echo agentrl-setup-ran-$AGENTRL_SITE >&2]"]
    cfg = load_config("smoke", overrides)
    text = sbatch.render_hetjob(topology.plan(cfg, str(ROOT)), "smoke", overrides)
    assert f"cd {ROOT}\n" in text and f"RUN_DIR={tmp_path}/runs/smoke-" in text
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    job = sbatch_script(text, elsewhere / "smoke.sbatch")
    wait_until(lambda: job_gone(job), 180, f"job {job} did not finish")
    run_dir = tmp_path / "runs" / f"smoke-{job}"
    log = (elsewhere / f"agentrl-smoke-{job}.out").read_text()
    assert json.loads((run_dir / "report" / "summary.json").read_text())["rl_steps"] == 2, log
    for role in ("controller-0", "env_worker-0", "pipeline"):  # the MPMD step: each program ran the set-up
        assert "agentrl-setup-ran-ok" in (run_dir / "logs" / f"{role}.log").read_text(), role
    state = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state, state


def test_submitit_hetjob_executor(slurm, job_env, tmp_path: Path) -> None:
    """~3-5 s. submitit's handle and result, with the function in group 0 and a step in group 1."""
    from agentrl.launch.submit import HetSlurmExecutor

    ex = HetSlurmExecutor(tmp_path / "submitit", [[("ntasks", "2"), ("cpus-per-task", "1"), ("time", "5")]])
    ex.update_parameters(use_srun=False, time=5, stderr_to_stdout=True, additional_parameters={"ntasks": "1"})
    job = ex.submit(probe)
    result = job.result()
    assert result["het_size"] == "2"
    assert sorted(r["RANK"] for r in result["group1"]) == ["0", "1"]
    assert {r["WORLD_SIZE"] for r in result["group1"]} == {"2"}
    assert {r["AGENTRL_HET_GROUP"] for r in result["group1"]} == {"1"}
    text = job.paths.submission_file.read_text()
    assert text.count("#SBATCH hetjob") == 1 and "#SBATCH --ntasks=2" in text.split("#SBATCH hetjob")[1]


def test_submitit_smoke_run_as_one_hetjob(slurm, job_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """~20-40 s. The smoke run (expert engine; the synchronous schedule) through `submit.submit`: three het
    groups, the services srun steps, trainer and rollout rank one MPMD step, `job.result()` is the run's
    summary."""
    from agentrl.launch import submit

    monkeypatch.chdir(tmp_path)
    cfg = load_config("smoke", SMALL)
    (job,) = submit.submit(cfg, "smoke", SMALL, tmp_path / "submitit")
    summary = job.result()
    assert summary["rl_steps"] == 2 and summary["schedule"] == "sync"
    assert summary["success_after_rl"] == 1.0  # the scripted expert solves every lookup sample
    run_dir = tmp_path / "runs" / f"smoke-{job.job_id}"
    logs = sorted(p.name for p in (run_dir / "logs").iterdir())
    assert logs == ["controller-0.log", "env_worker-0.log", "pipeline.log"]


def test_submitit_smoke_run_as_jobs_per_role(slurm, job_env, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """~20-40 s. cluster.hetjob=false (with the file channel: no MPI world spans jobs): env, trainer and
    rollout jobs chained with --dependency=after; the rollout job's result is the summary, and it cancels the
    env job at the end."""
    from agentrl.launch import submit

    monkeypatch.chdir(tmp_path)
    overrides = [*SMALL, "cluster.hetjob=false", "transport.channel=files"]
    env_job, trainer_job, rollout_job = submit.submit(load_config("smoke", overrides), "smoke", overrides,
                                                      tmp_path / "submitit")
    assert rollout_job.result()["rl_steps"] == 2
    assert trainer_job.result() is None
    assert "--dependency=after:" + env_job.job_id in trainer_job.paths.submission_file.read_text()
    assert "--dependency=after:" + trainer_job.job_id in rollout_job.paths.submission_file.read_text()
    wait_until(lambda: job_gone(env_job.job_id), 30, "the env job was not cancelled")
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == [
        "controller-0.log", "env_worker-0.log", "rollout-0.log", "trainer-0.log"]


class Counter(_Preemptible):
    """A stateful job for submitit's checkpoint/requeue through our `checkpoint` (the one `HetRun` has):
    consumes t0, t1, ... one per step."""

    def __init__(self) -> None:
        self.state: tuple[int, tuple[str, ...]] = (0, ())  # one assignment per step: a signal sees old or new
        self.starts: list[tuple[int, int]] = []

    def __call__(self, state_dir: str, steps: int) -> dict:
        self.starts.append((int(os.environ.get("SLURM_RESTART_COUNT", "0")), self.state[0]))
        while self.state[0] < steps:
            time.sleep(0.5)
            step, consumed = self.state
            self.state = (step + 1, (*consumed, f"t{step}"))
            (Path(state_dir) / "progress").write_text(str(step + 1))
        return {"consumed": list(self.state[1]), "starts": self.starts}


def test_submitit_checkpoint_and_requeue_with_the_hetjob_executor(slurm, job_env, tmp_path: Path) -> None:
    """~20-30 s. submitit's preemption signal reaches its handler in the batch shell (`B:` in the signal
    we render), which checkpoints the callable and requeues the het job; the result is complete."""
    from agentrl.launch.submit import HetSlurmExecutor, slurm_parameters

    ex = HetSlurmExecutor(tmp_path / "submitit", [[("ntasks", "1"), ("cpus-per-task", "1"), ("time", "5")]])
    ex.update_parameters(**slurm_parameters("agentrl-counter", (("time", "5"), ("ntasks", "1")), 60))
    job = ex.submit(Counter(), str(tmp_path), 12)
    assert "#SBATCH --signal=B:USR2@60" in job.paths.submission_file.read_text()
    progress = tmp_path / "progress"
    wait_until(lambda: progress.exists() and int(progress.read_text() or 0) >= 3, 60, "no progress")
    subprocess.run(["scancel", "--batch", "--signal=USR2", job.job_id], check=True)
    result = job.result()
    assert result["consumed"] == [f"t{i}" for i in range(12)]
    assert result["starts"][0] == (0, 0) and len(result["starts"]) == 2
    assert result["starts"][1][0] == 1 and 3 <= result["starts"][1][1] < 12


def test_mpi_world_across_het_groups(slurm, job_env, tmp_path: Path) -> None:
    """~3-5 s. One MPMD step over two het groups (1 + 2 tasks) is one MPI world of 3."""
    pytest.importorskip("mpi4py", reason="mpi4py (and the mpich wheel) are needed for the MPI test")
    script = "\n".join([
        "#!/bin/bash",
        "#SBATCH --job-name=agentrl-mpi-test",
        f"#SBATCH --output={tmp_path}/mpi-%j.out",
        "#SBATCH --ntasks=1 --cpus-per-task=1 --time=5",
        "#SBATCH hetjob",
        "#SBATCH --ntasks=2 --cpus-per-task=1 --time=5",
        f"srun --mpi=pmi2 --het-group=0 {sys.executable} {JOBS / 'mpi_allreduce.py'} : "
        f"--het-group=1 {sys.executable} {JOBS / 'mpi_allreduce.py'}",
        "",
    ])
    job = sbatch_script(script, tmp_path / "mpi.sbatch")
    wait_until(lambda: job_gone(job), 60, f"MPI job {job} did not finish")
    out = (tmp_path / f"mpi-{job}.out").read_text()
    rows = sorted((json.loads(line) for line in out.splitlines() if line.startswith("{")), key=lambda r: r["mpi_rank"])
    assert len(rows) == 3, out
    assert {r["sum"] for r in rows} == {1 + 2 + 3} and {r["mpi_size"] for r in rows} == {3}
    assert [(r["het_group"], r["rank"], r["world_size"]) for r in rows] == [(0, 0, 1), (1, 0, 2), (1, 1, 2)]
    assert [r["env_mpi_rank"] for r in rows] == [0, 1, 2]


def test_usr1_checkpoints_requeues_and_resumes(slurm, job_env, tmp_path: Path) -> None:
    """~25-35 s (cred_expire=10 s before the requeued job may start). The rendered scripts' own USR1 trap
    passes the signal to the step; the step checkpoints; the script requeues; the ledger survives."""
    steps = 12
    script = "\n".join([
        "#!/bin/bash",
        "#SBATCH --job-name=agentrl-requeue-test",
        f"#SBATCH --output={tmp_path}/requeue-%j.out",
        "#SBATCH --open-mode=append --requeue --ntasks=1 --cpus-per-task=1 --time=5",
        "set -u",
        sbatch._WAIT_STEP,
        sbatch._TRAP_USR1,
        "export AGENTRL_REQUEUE_BY_SCRIPT=1",
        f"srun --ntasks=1 {sys.executable} {JOBS / 'preempt_counter.py'} {tmp_path} {steps} 0.5 &",
        "TRAINER=$!",
        *sbatch._finish_lines(["TRAINER"], []),
        "",
    ])
    job = sbatch_script(script, tmp_path / "requeue.sbatch")
    progress = tmp_path / "progress"
    wait_until(lambda: progress.exists() and int(progress.read_text() or 0) >= 3, 60, "no progress")
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True)
    wait_until(lambda: (tmp_path / "done").exists(), 120, f"job {job} did not finish after the requeue")
    state = json.loads((tmp_path / "ckpt.json").read_text())
    assert state["step"] == steps
    assert state["consumed"] == [f"t{i}" for i in range(steps)]  # nothing lost, nothing twice
    starts = [tuple(map(int, line.split())) for line in (tmp_path / "starts.log").read_text().splitlines()]
    assert starts[0] == (0, 0) and len(starts) == 2
    restart_count, resumed_at = starts[1]
    assert restart_count == 1 and 3 <= resumed_at < steps
    log = (tmp_path / f"requeue-{job}.out").read_text()
    assert "preempted by SIGUSR1" in log and "requeueing job" in log
