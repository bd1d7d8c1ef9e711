"""`python -m jobs.launch --eval ...`: the evaluation's one-node job, rendered (a golden file) and submitted.

After a deliberate change to the rendering, regenerate and read the diff:
    AGENTRL_REGEN_GOLDEN=1 python -m pytest tests/evaluation/test_launch_eval.py
Submission is checked against a stand-in `sbatch` on PATH (what it was given, what the launcher printed);
a real Slurm job of the same command is in docs/report.md section 5.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden" / "eval-site.sbatch"
REGEN = os.environ.get("AGENTRL_REGEN_GOLDEN") == "1"
SITE = ["--eval", "runs/demo@v30", "--tasks", "alfworld,db,kg,os,webshop", "--runs", "4", "--label", "demo v30",
        "--slurm-partition", "gpu", "--slurm-account", "proj42", "--slurm-time", "08:00:00", "--slurm-gpus", "1",
        "--slurm-cpus", "32", "--slurm-mem", "200G", "--slurm-python", "python",
        "--slurm-setup", "module load cuda/12.4", "--slurm-setup", "source /srv/venvs/agentrl/bin/activate"]


def _launch(args: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jobs.launch", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def test_rendered_eval_job_matches_golden() -> None:
    p = _launch([*SITE, "--render-sbatch"])
    assert p.returncode == 0, p.stderr
    if REGEN:
        GOLDEN.write_text(p.stdout)
    assert p.stdout == GOLDEN.read_text()
    # the same script as jobs.eval's own --render-sbatch
    q = subprocess.run([sys.executable, "-m", "jobs.eval", *SITE[1:], "--render-sbatch"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert q.stdout == p.stdout


def test_eval_job_submitted_through_sbatch(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "sbatch"
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/argv\ncp "$2" {tmp_path}/script\necho "4242;cluster"\n')
    fake.chmod(0o755)
    p = _launch(SITE, {"PATH": f"{bin_dir}:{os.environ['PATH']}"}, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("submitted Slurm job 4242 (runs/eval-jobs/agentrl-eval-")
    argv = (tmp_path / "argv").read_text().split()
    assert argv[0] == "--parsable" and argv[1].startswith("runs/eval-jobs/")
    assert (tmp_path / "script").read_text() == GOLDEN.read_text()  # what was submitted is the rendered job
    assert (tmp_path / argv[1]).read_text() == GOLDEN.read_text()  # and it is kept
    fake.write_text("#!/bin/sh\necho 'sbatch: error: invalid partition specified: gpu' >&2\nexit 1\n")
    p = _launch(SITE, {"PATH": f"{bin_dir}:{os.environ['PATH']}"}, cwd=tmp_path)
    assert p.returncode == 1 and "invalid partition specified: gpu" in p.stderr
