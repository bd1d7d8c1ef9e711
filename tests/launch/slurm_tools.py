"""Helpers of the `slurm`-marked tests (imported by name: pytest puts this directory on sys.path)."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path


def wait_until(cond, timeout_s: float, what: str, poll_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(poll_s)
    raise TimeoutError(f"{what} within {timeout_s:.0f}s")


def job_gone(job_id: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
    return out.stdout.strip() == ""


def sbatch_script(text: str, path: Path) -> str:
    path.write_text(text)
    out = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True, check=True,
                         cwd=path.parent)
    return out.stdout.strip().split(";")[0]
