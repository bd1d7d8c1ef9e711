"""The seccomp filter of a bubblewrap session: the system calls that reach kernel objects shared with other
sessions and the host are refused.

Why: namespaces do not cover everything. Kernel keys are kept per host uid, and /proc/keys shows a key to
every process of that uid (one session's key readable in another); inotify and fanotify instances are
counted per user up the user-namespace chain to the host user that made the sandbox's namespace (one os
session held all 128 inotify instances of the host's root, and the next session and the host got errno
24); a pipe's buffer can be grown to 1 MB (`F_SETPIPE_SZ`), and the pages are counted per host uid
(`pipe-user-pages-soft`): past them every new pipe of that uid gets one page. POSIX message queues
(`RLIMIT_MSGQUEUE`, per uid), io_uring, userfaultfd, perf events and BPF are more kernel state no task
needs (Docker's default profile refuses most of them too). Kernel AIO contexts (`io_setup`) are counted
host-wide (`fs.aio-nr` against `fs.aio-max-nr`): one session once held all 65,536 events and the next
session and the host's root got EAGAIN; refused, glibc's POSIX AIO (threads) still works. Files passed over
a Unix socket and not yet received (SCM_RIGHTS "in flight") are held by no process, so RLIMIT_NOFILE does
not count them; the kernel bounds them per real uid (`too_many_unix_fds`: at most the sender's
RLIMIT_NOFILE), and a session's root may become any of its 65,536 ids: cycling through them, one session
held 1,000 files in flight per uid (measured), millions in all, past its share of the host's file table.
So the real uids a session's processes may take are few (`real_uids`): root, nobody and the first
`user_uids` regular users (1000...), and the session's open-file budget counts each of them as a holder
(`SandboxConfig.holders`).

What the filter does (`seccomp_filter`): on this machine's architecture, each call in `DENIED` fails with
ENOSYS (as on a kernel built without it: `tail -f` falls back to polling), `fcntl(fd, F_SETPIPE_SZ, n)`
fails with EPERM (as past `pipe-max-size`), `setuid`, `setreuid` and `setresuid` to a real uid outside
`real_uids` fail with EPERM (an effective or saved uid is free: `seteuid` works), x32 system calls and
those of another architecture (i386 through `int 0x80`) fail with ENOSYS; everything else is allowed. It
is classic BPF, built here as bytes (eight per instruction: code u16, jt u8, jf u8, k u32, native order)
and handed to bubblewrap's `--seccomp FD`, which loads it before the sandbox's first process runs; every
process of the session inherits it. bubblewrap sets no_new_privs either way, so the filter adds no
restriction on setuid programs.

Not here: who applies it (`agentrl.sandbox.shell.Shell`). Apptainer sessions get no filter from us (its
`--security seccomp:` needs a root-owned profile); docs/tasks.md says so.
"""
from __future__ import annotations

import errno
import os
import platform
import struct

# classic BPF opcodes (linux/filter.h)
LD_W_ABS = 0x20
JEQ_K = 0x15
JGE_K = 0x35
RET_K = 0x06
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
NR_OFFSET, ARCH_OFFSET = 0, 4


def _arg_low(i: int) -> int:
    """Offset of the low 32 bits of argument `i` in `struct seccomp_data` (little-endian machines)."""
    return 16 + 8 * i


F_SETPIPE_SZ = 1031
X32_BIT = 0x40000000
JGT_K = 0x25
FIRST_USER, NOBODY, UNCHANGED = 1000, 65534, 0xFFFFFFFF
SET_UIDS = ("setuid", "setreuid", "setresuid")
"""The calls whose first argument is the real uid to take."""

ARCHES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (0xC000003E, {
        "add_key": 248, "request_key": 249, "keyctl": 250, "inotify_init": 253, "inotify_init1": 294,
        "fanotify_init": 300, "perf_event_open": 298, "bpf": 321, "userfaultfd": 323, "mq_open": 240,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "io_setup": 206, "fcntl": 72,
        "setuid": 105, "setreuid": 113, "setresuid": 117}),
    "aarch64": (0xC00000B7, {
        "add_key": 217, "request_key": 218, "keyctl": 219, "inotify_init1": 26, "fanotify_init": 262,
        "perf_event_open": 241, "bpf": 280, "userfaultfd": 282, "mq_open": 180,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "io_setup": 0, "fcntl": 25,
        "setreuid": 145, "setuid": 146, "setresuid": 147}),
}
"""Per machine: the audit architecture and the system call numbers the filter names."""
DENIED = ("add_key", "request_key", "keyctl", "inotify_init", "inotify_init1", "fanotify_init", "perf_event_open",
          "bpf", "userfaultfd", "mq_open", "io_uring_setup", "io_uring_enter", "io_uring_register", "io_setup")


class SeccompUnavailable(RuntimeError):
    """No filter is known for this machine's architecture."""


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def real_uids(user_uids: int) -> list[tuple[int, int]]:
    """The real uids a session's processes may take, as [first, last] ranges: root, the first `user_uids`
    regular users (useradd's 1000, 1001, ...) and nobody."""
    return [(0, 0), (FIRST_USER, FIRST_USER + user_uids - 1), (NOBODY, NOBODY)] if user_uids > 0 else \
        [(0, 0), (NOBODY, NOBODY)]


def seccomp_filter(machine: str | None = None, user_uids: int = 8) -> bytes:
    """The session's filter as a classic BPF program (module docstring) for `machine` (default: this one's),
    whose processes may take as real uid only those of `real_uids(user_uids)`."""
    machine = machine or platform.machine()
    if machine not in ARCHES:
        raise SeccompUnavailable(f"no seccomp filter for {machine!r} (known: {', '.join(ARCHES)})")
    arch, numbers = ARCHES[machine]
    enosys, eperm = RET_ERRNO | errno.ENOSYS, RET_ERRNO | errno.EPERM
    prog = [_insn(LD_W_ABS, ARCH_OFFSET), _insn(JEQ_K, arch, 1, 0), _insn(RET_K, enosys),
            _insn(LD_W_ABS, NR_OFFSET)]
    if machine == "x86_64":  # the x32 ABI's numbers have this bit; none of them is needed
        prog += [_insn(JGE_K, X32_BIT, 0, 1), _insn(RET_K, enosys)]
    for name in DENIED:
        if name in numbers:
            prog += [_insn(JEQ_K, numbers[name], 0, 1), _insn(RET_K, enosys)]
    # set*uid(ruid, ...): "unchanged" (-1) or one of `real_uids`, else EPERM. Each range [lo, hi] is two
    # tests (acc < lo: denied, as the ranges ascend; acc > hi: the next range); the block ends in a verdict
    # (the accumulator holds the argument, not the call's number, after its first instruction)
    ranges = [*real_uids(user_uids), (UNCHANGED, UNCHANGED)]
    n = len(ranges)
    block = [_insn(LD_W_ABS, _arg_low(0))]
    for k, (lo, hi) in enumerate(ranges):
        block += [_insn(JGE_K, lo, 0, 2 * n - 2 * k - 1), _insn(JGT_K, hi, 0, 2 * n - 2 * k - 1)]
    block += [_insn(RET_K, eperm), _insn(RET_K, RET_ALLOW)]
    for name in SET_UIDS:
        prog += [_insn(JEQ_K, numbers[name], 0, len(block)), *block]
    # fcntl(fd, F_SETPIPE_SZ, ...) -> EPERM; any other fcntl, and everything else, is allowed
    prog += [_insn(JEQ_K, numbers["fcntl"], 0, 3), _insn(LD_W_ABS, _arg_low(1)), _insn(JEQ_K, F_SETPIPE_SZ, 0, 1),
             _insn(RET_K, eperm), _insn(RET_K, RET_ALLOW)]
    return b"".join(prog)


def filter_fd(program: bytes) -> int:
    """A pipe's read end holding `program` (what `bwrap --seccomp FD` reads to its end); the caller passes it
    to the sandbox's process and closes it after the start."""
    r, w = os.pipe()
    try:
        os.write(w, program)  # far below a pipe's buffer: a program is a few hundred bytes
    finally:
        os.close(w)
    return r
