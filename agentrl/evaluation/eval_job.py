"""An evaluation as one sbatch script: one node, one task; `jobs.eval` itself starts the controller and the
env workers beside its engine (as it does on a workstation), so the job needs no heterogeneous groups.

    python -m jobs.eval runs/demo --tasks os,db --render-sbatch --slurm-partition gpu > eval.sbatch
    sbatch eval.sbatch
    python -m jobs.launch --eval runs/demo --tasks os,db --slurm-partition gpu      # the same, submitted

The job may be requeued or submitted again at will: `jobs.eval` skips what its results file holds, and
Slurm's SIGTERM at the time limit stops it with whole lines in that file. Standard library only; separate
from `agentrl.launch.sbatch` (the training job's renderer), whose hetjob machinery an evaluation does not need.
"""
from __future__ import annotations

import argparse
import shlex
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EvalJob:
    job_name: str = "agentrl-eval"
    partition: str = ""
    account: str = ""
    qos: str = ""
    time: str = "04:00:00"
    gpus: int = 1
    cpus: int = 16
    mem: str = ""
    python: str = "python"
    """The interpreter on the node (a venv's, or plain `python` after `setup`)."""
    setup: tuple[str, ...] = ()
    """Shell lines run before it, e.g. `module load cuda/12.4`, `source /srv/venv/bin/activate`."""


# jobs.eval's options that shape the job rather than the evaluation: (option, takes a value).
SLURM_OPTIONS: dict[str, bool] = {"--render-sbatch": False, "--slurm-partition": True, "--slurm-account": True,
                                  "--slurm-qos": True, "--slurm-time": True, "--slurm-gpus": True,
                                  "--slurm-cpus": True, "--slurm-mem": True, "--slurm-job-name": True,
                                  "--slurm-python": True, "--slurm-setup": True}


def add_slurm_arguments(ap: argparse.ArgumentParser) -> None:
    """jobs.eval's --slurm-* options (`SLURM_OPTIONS`), into its parser or into `job_of`'s."""
    job = ap.add_argument_group("Slurm", "--render-sbatch prints a one-node sbatch script of this evaluation "
                                         "(python -m jobs.launch --eval ... submits it)")
    job.add_argument("--render-sbatch", action="store_true")
    job.add_argument("--slurm-partition", default="")
    job.add_argument("--slurm-account", default="")
    job.add_argument("--slurm-qos", default="")
    job.add_argument("--slurm-time", default="04:00:00")
    job.add_argument("--slurm-gpus", type=int, default=1)
    job.add_argument("--slurm-cpus", type=int, default=16)
    job.add_argument("--slurm-mem", default="")
    job.add_argument("--slurm-job-name", default="agentrl-eval")
    job.add_argument("--slurm-python", default="python", help="the interpreter on the node, e.g. a venv's")
    job.add_argument("--slurm-setup", action="append", default=[], metavar="LINE",
                     help="a shell line before it (repeatable), e.g. 'module load cuda/12.4'")


def job_of(argv: Sequence[str]) -> EvalJob:
    """The job that jobs.eval's arguments `argv` ask for (their --slurm-* options; the others are left alone)."""
    ap = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_slurm_arguments(ap)
    a, _ = ap.parse_known_args(list(argv))
    return EvalJob(a.slurm_job_name, a.slurm_partition, a.slurm_account, a.slurm_qos, a.slurm_time, a.slurm_gpus,
                   a.slurm_cpus, a.slurm_mem, a.slurm_python, tuple(a.slurm_setup))


def eval_argv(argv: Sequence[str]) -> list[str]:
    """`argv` without the job's own options (`SLURM_OPTIONS`, also in --opt=value form)."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in SLURM_OPTIONS:
            skip = SLURM_OPTIONS[name] and "=" not in a
            continue
        out.append(a)
    return out


def render(job: EvalJob, args: Sequence[str]) -> str:
    """The sbatch script that runs `python -m jobs.eval ARGS` on one node (plain progress lines in the log)."""
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job.job_name}", "#SBATCH --nodes=1", "#SBATCH --ntasks=1",
             f"#SBATCH --cpus-per-task={job.cpus}"]
    if job.gpus:
        lines.append(f"#SBATCH --gpus-per-task={job.gpus}")
    for key, value in (("partition", job.partition), ("account", job.account), ("qos", job.qos),
                       ("mem", job.mem)):
        if value:
            lines.append(f"#SBATCH --{key}={value}")
    lines += [f"#SBATCH --time={job.time}", "#SBATCH --output=%x-%j.out", "#SBATCH --requeue",
              "#SBATCH --signal=TERM@120", "",
              "# One node: jobs.eval starts the controller and env workers beside its engine; a requeued or",
              "# resubmitted job goes on from its results file (the episodes already scored are skipped).",
              "set -euo pipefail", 'cd "$SLURM_SUBMIT_DIR"', *job.setup,
              "srun --ntasks=1 --cpus-per-task=$SLURM_CPUS_PER_TASK "
              + " ".join(shlex.quote(a) for a in [job.python, "-m", "jobs.eval", *args, "--progress", "lines"]), ""]
    return "\n".join(lines)


def submit(script: str, folder: Path, job_name: str = "agentrl-eval") -> tuple[str, Path]:
    """Write `script` under `folder` (kept: what was submitted) and `sbatch` it from the current directory
    (the script's `cd "$SLURM_SUBMIT_DIR"`); returns (job id, script path). Raises RuntimeError with sbatch's
    own message when it refuses the job."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{job_name}-{time.strftime('%Y%m%d-%H%M%S')}.sbatch"
    path.write_text(script)
    p = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"sbatch {path}: {p.stderr.strip() or p.stdout.strip()}")
    return p.stdout.strip().split(";")[0], path
