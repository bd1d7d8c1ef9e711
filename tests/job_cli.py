"""Entry points as a user runs them: `python -m jobs.<name> ...` in a subprocess from the repository root (tests
import the library, never `jobs/`: `tests/test_dependencies.py`)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_job(name: str, *argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run `python -m jobs.<name> argv...`; its return code, stdout and stderr come back as text."""
    return subprocess.run([sys.executable, "-m", f"jobs.{name}", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
