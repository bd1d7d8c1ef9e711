"""The submitit front end: one heterogeneous Slurm job (or one job per role) submitted from Python.

submitit has no hetjob API (https://github.com/facebookincubator/submitit/issues/1741). `HetSlurmExecutor`
extends its Slurm executor where the sbatch file is made: submitit renders its own script (group 0: the
pickled function, its logs, its `--signal` and requeue handling), and we append one `#SBATCH hetjob` block per
further group after its last `#SBATCH` line. Everything else stays submitit's: the job handle, `job.result()`,
the logs in its folder, and checkpoint/requeue on its preemption signal (USR2 by default).

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import submitit
from submitit.slurm.slurm import SlurmExecutor

from agentrl.config import RunConfig
from agentrl.launch import slurm_env, topology
from agentrl.launch.preempt import REQUEUE_BY_SCRIPT
from agentrl.launch.sbatch import SETUP_FILE, setup_script, step_argv, task_argv


class HetSlurmExecutor(SlurmExecutor):
    """submitit's SlurmExecutor whose job has further het groups, each a list of (sbatch key, value).

    The executor's own parameters describe group 0 (where the function runs). Give group 0's task
    counts through `additional_parameters`, not `nodes`/`ntasks_per_node`: submitit counts the latter
    as tasks of the function and would wait for a result from each."""

    def __init__(self, folder: str | Path, het_groups: list[list[tuple[str, str]]], max_num_timeout: int = 3) -> None:
        super().__init__(folder=folder, max_num_timeout=max_num_timeout)
        self.het_groups = het_groups

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        if not self.parameters.get("use_srun", True) and not self.parameters.get("teardown"):
            # the function runs in the batch shell: make it *be* the batch shell, so that the `B:` warning
            # signal reaches submitit's handler (bash would not pass it on to a child)
            command = f"exec {command}"
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


def slurm_parameters(name: str, directives: tuple[tuple[str, str], ...], signal_s: int,
                     extra: dict[str, str] | None = None, setup: tuple[str, ...] = ()) -> dict[str, Any]:
    """submitit parameters for one group's directives.

    The function runs in the batch shell (`use_srun=False`: it starts the roles' steps itself), so the
    warning signal goes to the batch shell only (`B:`): submitit's handler checkpoints and requeues,
    while the roles' steps are not killed by a USR2 they do not handle. `setup` (cluster.setup) runs in the
    batch shell before the function, as submitit's own `setup` lines."""
    d = dict(directives)
    params: dict[str, Any] = {k.replace("-", "_"): v for k, v in d.items() if k != "time"}
    params |= {"requeue": True, "signal": f"B:{submitit.JobEnvironment.USR_SIG}@{signal_s}"}
    return dict(job_name=name, use_srun=False, stderr_to_stdout=True, time=_time_minutes(d["time"]),
                additional_parameters=params | (extra or {}), **({"setup": list(setup)} if setup else {}))


def executor_for(cfg: RunConfig, folder: str | Path) -> HetSlurmExecutor:
    """An executor for `cfg`'s groups: group 0 (trainer) carries the function, then rollout, then env."""
    layout = topology.plan(cfg)
    ex = HetSlurmExecutor(folder, [list(g.directives) for g in layout.groups[1:]])
    ex.update_parameters(**slurm_parameters(f"agentrl-{cfg.name}", layout.groups[topology.TRAINER].directives,
                                            cfg.cluster.signal_s, setup=cfg.cluster.setup))
    return ex


@dataclass
class _Task:
    """A running srun step, and how often it may still be started again when it fails."""

    argv: list[str]
    proc: subprocess.Popen
    restarts_left: int = 0


def _start_steps(cfg: RunConfig, run_dir: Path, group: int | None) -> dict[str, _Task]:
    """Start the run's role steps (all of them in a het job; `group`'s alone in a per-role job). A restartable
    step (env workers) starts one step per task, named `<role>-<task>`."""
    py, het = sys.executable, group is None
    image, binds = cfg.cluster.env.apptainer_image, cfg.cluster.env.binds
    if cfg.cluster.setup:  # every step runs its program through it (sbatch.role_argv)
        (run_dir / SETUP_FILE).write_text(setup_script(cfg.cluster.setup))
    tasks: dict[str, _Task] = {}
    for step in topology.plan(cfg).steps:
        if not (het or step.group == group):
            continue
        if step.restarts:
            for i in range(step.ntasks):
                argv = task_argv(step, str(i), py, str(run_dir), image, "data", binds, het)
                tasks[f"{step.role}-{i}"] = _Task(argv, subprocess.Popen(argv), step.restarts)
        else:
            argv = step_argv(step, py, str(run_dir), image, "data", binds, het)
            tasks[step.role] = _Task(argv, subprocess.Popen(argv))
    return tasks


def _finish(tasks: dict[str, _Task], ends: list[str], run_dir: Path, poll_s: float = 0.5) -> None:
    """Wait for the `ends` roles, starting a failed restartable task again meanwhile (at most its bound; past
    it the run goes on without it); then stop the rest (srun passes SIGTERM on; the roles drain and exit)."""
    ends = [name for name in tasks if name in ends or name.rpartition("-")[0] in ends]  # a role's tasks too
    try:
        while True:
            for name, t in tasks.items():
                rc = t.proc.poll()
                if rc not in (None, 0) and t.restarts_left > 0:
                    t.restarts_left -= 1
                    print(f"agentrl: {name} exited with {rc}; starting it again ({t.restarts_left} restarts left)",
                          flush=True)
                    t.proc = subprocess.Popen(t.argv)
            if all(tasks[name].proc.poll() is not None for name in ends):
                break
            time.sleep(poll_s)
        codes = {name: tasks[name].proc.returncode for name in ends}
    finally:
        for t in tasks.values():
            if t.proc.poll() is None:
                t.proc.terminate()
        for t in tasks.values():
            t.proc.wait()
    if any(codes.values()):
        raise RuntimeError(f"roles failed: {codes}; logs in {run_dir / 'logs'}")


def _make_model(run_dir: Path, het: bool) -> None:
    if not (run_dir / "model" / "config.json").exists():
        group = [f"--het-group={topology.TRAINER}"] if het else []
        subprocess.run(["srun", "--mpi=none", *group, "--ntasks=1", sys.executable, "-m", "jobs.make_model",
                        "--run-dir", str(run_dir)], check=True)


class _Preemptible(submitit.helpers.Checkpointable):
    """On submitit's signal: USR1 to the trainer step (it checkpoints and exits), then requeue with the
    same arguments; the restarted job finds the run dir and resumes."""

    trainer: subprocess.Popen | None = None

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        if self.trainer is not None and self.trainer.poll() is None:
            self.trainer.send_signal(signal.SIGUSR1)
            deadline = time.monotonic() + 60
            while self.trainer.poll() is None and time.monotonic() < deadline:
                time.sleep(0.5)
        fresh = type(self).__new__(type(self))
        fresh.__dict__.update({k: v for k, v in self.__dict__.items() if k != "trainer"})
        # submitit requeues next, with `scontrol requeue` run from this process: the requeue sends SIGTERM
        # to every process of the job, scontrol too, and a scontrol that has not exited by then dies of it;
        # submitit then records the job as failed although it was requeued (seen on a loaded 2-core node:
        # `job.result()` raised CalledProcessError). An ignored signal stays ignored across exec, so scontrol
        # finishes; this process loses nothing (submitit's own SIGTERM handler only logged it).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return submitit.helpers.DelayedSubmission(fresh, *args, **kwargs)


class HetRun(_Preemptible):
    """The het job's function: every role as an srun step; returns report/summary.json."""

    def __call__(self, preset: str, overrides: list[str], root: str) -> dict[str, Any]:
        from agentrl.launch.prepare import prepare_run

        os.chdir(root)
        name = [o.split("=", 1)[1] for o in overrides if o.startswith("name=")]
        place = slurm_env.read()
        assert place is not None, "HetRun runs inside a Slurm job"
        run_dir = Path("runs") / f"{name[-1] if name else Path(preset).stem}-{place.job_id}"
        cfg, resumed = prepare_run(preset, [*overrides, "controller.host=0.0.0.0"], run_dir)
        print(f"agentrl: run dir {run_dir} ({'resuming' if resumed else 'new'})", flush=True)
        os.environ[REQUEUE_BY_SCRIPT] = "1"  # the trainer checkpoints and exits; submitit requeues
        if topology.plan(cfg).needs_model:
            _make_model(run_dir, het=True)
        tasks = _start_steps(cfg, run_dir, None)
        self.trainer = tasks["trainer"].proc  # the MPMD step whose rank 0 is the trainer (MPI channel)
        _finish(tasks, [s.role for s in topology.plan(cfg).steps if s.ends_run], run_dir)
        return json.loads((run_dir / "report" / "summary.json").read_text())


class RoleJob(_Preemptible):
    """One role group's job where hetjobs are forbidden: env (serves until the rollout job cancels it),
    trainer (builds the tiny model first if the run has none), rollout (returns report/summary.json)."""

    def __init__(self, group: int) -> None:
        self.group = group

    def __call__(self, run_dir: str, root: str, env_job: str | None = None) -> dict[str, Any] | None:
        from agentrl.config import load_config

        os.chdir(root)
        path = Path(run_dir)
        cfg = load_config(str(path / "config.yaml"))
        os.environ[REQUEUE_BY_SCRIPT] = "1"
        needs_model = topology.plan(cfg).needs_model
        if self.group == topology.TRAINER and needs_model:
            _make_model(path, het=False)
        while self.group == topology.ROLLOUT and needs_model and not (path / "model" / "config.json").exists():
            time.sleep(2)  # the trainer job builds it
        tasks = _start_steps(cfg, path, self.group)
        self.trainer = tasks["trainer"].proc if "trainer" in tasks else None
        ends = [r for r in ("rollout", "trainer") if any(n == r or n.startswith(f"{r}-") for n in tasks)] or list(tasks)
        _finish(tasks, ends, path)
        if self.group != topology.ROLLOUT:
            return None
        if env_job:
            subprocess.run(["scancel", env_job], check=False)
        return json.loads((path / "report" / "summary.json").read_text())


def submit(cfg: RunConfig, preset: str, overrides: list[str], folder: Path) -> list[submitit.Job]:
    """Submit `cfg`'s run from the current directory: one heterogeneous job whose function is `HetRun`, or
    (cluster.hetjob false) env, trainer and rollout jobs, each started after the previous one. The last
    job's `result()` is the run's summary."""
    if cfg.cluster.hetjob:
        return [executor_for(cfg, folder).submit(HetRun(), preset, overrides, os.getcwd())]
    from agentrl.launch.prepare import prepare_run

    run_dir = Path("runs") / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    prepare_run(preset, [*overrides, "controller.host=0.0.0.0"], run_dir)
    layout = topology.plan(cfg)
    jobs: list[submitit.Job] = []
    for group in (topology.ENV, topology.TRAINER, topology.ROLLOUT):
        ex = submitit.SlurmExecutor(folder=folder)
        extra = {"dependency": f"after:{jobs[-1].job_id}"} if jobs else {}
        ex.update_parameters(**slurm_parameters(f"agentrl-{cfg.name}-{topology.GROUP_NAMES[group]}",
                                                layout.groups[group].directives, cfg.cluster.signal_s, extra,
                                                cfg.cluster.setup))
        env_job = jobs[0].job_id if group == topology.ROLLOUT else None
        jobs.append(ex.submit(RoleJob(group), str(run_dir), os.getcwd(), env_job))
    return jobs
