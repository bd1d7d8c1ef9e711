"""The `slurm` fixture: a running Slurm (bash .ci/slurm/start.sh) or a clear skip — a failure under CI=true;
`job_env`: what jobs submitted from a test import."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def slurm() -> None:
    why = None
    if not shutil.which("sbatch"):
        why = "no Slurm here (sbatch not on PATH): start one with `bash .ci/slurm/start.sh`"
    else:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=20)
        bad = ("down", "drain", "fail", "unk", "not_responding")
        usable = [line for line in out.stdout.splitlines() if not any(b in line.lower() for b in bad)]
        if out.returncode != 0 or len(usable) < 3:
            why = (f"Slurm is not up with three usable nodes (sinfo: {out.stdout.strip() or out.stderr.strip()}): "
                   "`bash .ci/slurm/start.sh`")
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)


@pytest.fixture
def job_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs inherit the submitting environment (sbatch's default): make them import this checkout (and this
    directory's modules, whose functions submitit pickles by reference)."""
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}:{Path(__file__).parent}")
    monkeypatch.setenv("AGENTRL_PYTHON", sys.executable)
