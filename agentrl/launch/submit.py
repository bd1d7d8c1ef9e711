"""The submitit front end: one heterogeneous Slurm job (or one job per role) submitted from Python.

submitit has no hetjob API (its issue #1741). `HetSlurmExecutor` extends its Slurm executor where the
sbatch file is made: submitit renders its own script (group 0: the pickled function, its logs, its
`--signal` and requeue handling), and we append one `#SBATCH hetjob` block per further group after its
last `#SBATCH` line. Everything else stays submitit's: the job handle, `job.result()`, the logs in
its folder, and checkpoint/requeue on its preemption signal (USR2 by default).

The function is `HetRun`: in group 0's batch shell (`use_srun=False`) it prepares the run dir and starts
every role as an `srun --het-group=N` step (the steps of `agentrl.launch.topology`, the same as the
rendered sbatch scripts). On submitit's signal its `checkpoint` passes USR1 to the trainer step, waits
for it to checkpoint and exit, and hands submitit a resubmission of itself: the requeued job resumes in
the same run directory. submitit's `job.state` needs sacct (slurmdbd); without it the state reads
UNKNOWN while results still arrive.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import submitit
from submitit.slurm.slurm import SlurmExecutor

from agentrl.config import RunConfig
from agentrl.launch import topology
from agentrl.launch.preempt import REQUEUE_BY_SCRIPT
from agentrl.launch.sbatch import role_argv, srun_argv


class HetSlurmExecutor(SlurmExecutor):
    """submitit's SlurmExecutor whose job has further het groups, each a list of (sbatch key, value).

    The executor's own parameters describe group 0 (where the function runs). Give group 0's task
    counts through `additional_parameters`, not `nodes`/`ntasks_per_node`: submitit counts the latter
    as tasks of the function and would wait for a result from each."""

    def __init__(self, folder: str | Path, het_groups: list[list[tuple[str, str]]], max_num_timeout: int = 3) -> None:
        super().__init__(folder=folder, max_num_timeout=max_num_timeout)
        self.het_groups = het_groups

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        lines = super()._make_submission_file_text(command, uid).split("\n")
        last = max(i for i, line in enumerate(lines) if line.startswith("#SBATCH"))
        extra: list[str] = []
        for group in self.het_groups:
            extra.append("#SBATCH hetjob")
            extra += [f"#SBATCH --{key}={shlex.quote(value)}" for key, value in group]
        return "\n".join(lines[: last + 1] + extra + lines[last + 1:])


def _time_minutes(slurm_time: str) -> int:
    """Slurm's D-HH:MM:SS (or MM, HH:MM:SS) in whole minutes, for submitit's `timeout_min`."""
    days, _, rest = slurm_time.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if len(parts) == 1:
        minutes = parts[0]
    else:
        parts = [0] * (3 - len(parts)) + parts
        minutes = parts[0] * 60 + parts[1] + (1 if parts[2] else 0)
    return int(days or 0) * 24 * 60 + minutes


def executor_for(cfg: RunConfig, folder: str | Path) -> HetSlurmExecutor:
    """An executor for `cfg`'s groups: group 0 (trainer) carries the function, then rollout, then env."""
    plan = topology.plan(cfg)
    group0 = dict(plan.groups[topology.TRAINER].directives)
    ex = HetSlurmExecutor(folder, [list(g.directives) for g in plan.groups[1:]])
    ex.update_parameters(
        job_name=f"agentrl-{cfg.name}", use_srun=False, stderr_to_stdout=True,
        time=_time_minutes(group0.pop("time")), signal_delay_s=cfg.cluster.signal_s,
        additional_parameters={k.replace("-", "_"): v for k, v in group0.items()} | {"requeue": True},
    )
    return ex


class HetRun(submitit.helpers.Checkpointable):
    """The job's function: every role as an srun step of the het job; returns report/summary.json."""

    def __init__(self) -> None:
        self.trainer: subprocess.Popen | None = None

    def __call__(self, preset: str, overrides: list[str], root: str) -> dict[str, Any]:
        from agentrl.launch.prepare import prepare_run

        os.chdir(root)
        job_id = os.environ["SLURM_JOB_ID"]
        name = [o.split("=", 1)[1] for o in overrides if o.startswith("name=")]
        run_dir = Path("runs") / f"{name[-1] if name else Path(preset).stem}-{job_id}"
        cfg, resumed = prepare_run(preset, [*overrides, "controller.host=0.0.0.0"], run_dir)
        print(f"agentrl: run dir {run_dir} ({'resuming' if resumed else 'new'})", flush=True)
        py = sys.executable
        os.environ[REQUEUE_BY_SCRIPT] = "1"  # the trainer checkpoints and exits; submitit requeues (checkpoint below)
        plan = topology.plan(cfg)
        if plan.needs_model and not (run_dir / "model" / "config.json").exists():
            subprocess.run(["srun", f"--het-group={topology.TRAINER}", "--ntasks=1", py, "-m", "jobs.make_model",
                            "--run-dir", str(run_dir)], check=True)
        procs: dict[str, subprocess.Popen] = {}
        for step in plan.steps:
            argv = srun_argv(step, True, str(run_dir)) + role_argv(
                step, py, str(run_dir), cfg.cluster.env.apptainer_image, "data", cfg.cluster.env.binds)
            procs[step.role] = subprocess.Popen(argv)
        self.trainer = procs["trainer"]
        try:
            codes = {s.role: procs[s.role].wait() for s in plan.steps if s.ends_run}
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.terminate()  # srun passes SIGTERM to the role, which drains and exits
            for p in procs.values():
                p.wait()
        if any(codes.values()):
            raise RuntimeError(f"roles failed: {codes}; logs in {run_dir / 'logs'}")
        return json.loads((run_dir / "report" / "summary.json").read_text())

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        """submitit's preemption signal: the trainer checkpoints (USR1) and exits, then requeue with the
        same arguments; the restarted job finds the run dir and resumes."""
        if self.trainer is not None and self.trainer.poll() is None:
            self.trainer.send_signal(signal.SIGUSR1)
            deadline = time.monotonic() + 60
            while self.trainer.poll() is None and time.monotonic() < deadline:
                time.sleep(0.5)
        return submitit.helpers.DelayedSubmission(HetRun(), *args, **kwargs)


def submit(cfg: RunConfig, preset: str, overrides: list[str], folder: Path) -> submitit.Job:
    """Submit `cfg`'s run: one heterogeneous job (cluster.hetjob) whose function is `HetRun`."""
    if not cfg.cluster.hetjob:
        raise NotImplementedError(
            "cluster.hetjob=false through submitit is not done yet: render the per-role jobs with "
            "`python -m jobs.launch --render-sbatch cluster.hetjob=false ...` and run that script")
    ex = executor_for(cfg, folder)
    return ex.submit(HetRun(), preset, overrides, os.getcwd())
