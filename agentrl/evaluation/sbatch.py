"""An evaluation as one sbatch script: one node, one task; `jobs.eval` itself starts the controller and the
env workers beside its engine (as it does on a workstation), so the job needs no heterogeneous groups.

    python -m jobs.eval runs/demo --tasks os,db --render-sbatch --slurm-partition gpu > eval.sbatch
    sbatch eval.sbatch

The job may be requeued or submitted again at will: `jobs.eval` skips what its results file holds, and
Slurm's SIGTERM at the time limit stops it with whole lines in that file. Standard library only; separate
from `agentrl.launch.sbatch` (the training job's renderer), whose hetjob machinery an evaluation does not need.
"""
from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass


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


# jobs.eval's options that shape the job rather than the evaluation: (option, takes a value).
SLURM_OPTIONS: dict[str, bool] = {"--render-sbatch": False, "--slurm-partition": True, "--slurm-account": True,
                                  "--slurm-qos": True, "--slurm-time": True, "--slurm-gpus": True,
                                  "--slurm-cpus": True, "--slurm-mem": True, "--slurm-job-name": True}


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
              "set -euo pipefail", 'cd "$SLURM_SUBMIT_DIR"',
              "srun --ntasks=1 --cpus-per-task=$SLURM_CPUS_PER_TASK "
              + " ".join(shlex.quote(a) for a in [job.python, "-m", "jobs.eval", *args, "--progress", "lines"]), ""]
    return "\n".join(lines)
