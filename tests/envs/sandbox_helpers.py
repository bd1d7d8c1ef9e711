"""What the sandbox tests need: bubblewrap and the os task's root file system.

In CI (`CI` set) both are installed by `.ci/run`, so a missing one fails the test; elsewhere the test
is skipped with the reason and the command that fixes it.
"""
from __future__ import annotations

import os
import shutil

import pytest

from agentrl.envs.sandbox.rootfs import default_rootfs_dir, is_rootfs


def missing_sandbox() -> str | None:
    """Why a real sandbox cannot run here, or None."""
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    if not is_rootfs(default_rootfs_dir()):
        return f"no os root file system at {default_rootfs_dir()} (python -m jobs.make_rootfs builds it)"
    return None


def require_sandbox() -> None:
    """Skip the calling test (fail it in CI) when a real sandbox cannot run here."""
    reason = missing_sandbox()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI installs the sandbox (.ci/run), but: {reason}")
        pytest.skip(reason)
