"""What the sandbox tests need: bubblewrap and the os task's root file system.

In CI (`CI` set) both are installed by `.ci/run`, so a missing one fails the test; elsewhere the test
is skipped with the reason and the command that fixes it.
"""
from __future__ import annotations

import os
import shutil
import struct

import pytest

from agentrl.sandbox.rootfs import default_rootfs_dir, is_rootfs


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


def run_filter(program: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """What a seccomp `program` returns for one system call: a small classic-BPF interpreter for the
    instructions `agentrl.sandbox.seccomp` uses (the tests check the filter with it, beside the
    kernel's own verdict in a sandbox)."""
    from agentrl.sandbox.seccomp import JEQ_K, JGE_K, JGT_K, LD_W_ABS, RET_K

    data = struct.pack("=iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    insns = [struct.unpack_from("=HBBI", program, i) for i in range(0, len(program), 8)]
    pc = acc = 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == LD_W_ABS:
            acc = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif code in (JEQ_K, JGE_K, JGT_K):
            hit = {JEQ_K: acc == k, JGE_K: acc >= k, JGT_K: acc > k}[code]
            pc += 1 + (jt if hit else jf)
        elif code == RET_K:
            return k
        else:
            raise ValueError(f"unknown instruction {code:#x}")
