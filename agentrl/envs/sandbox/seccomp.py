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
session and the host's root got EAGAIN; refused, glibc's POSIX AIO (threads) still works.

What the filter does (`seccomp_filter`): on this machine's architecture, each call in `DENIED` fails with
ENOSYS (as on a kernel built without it: `tail -f` falls back to polling), `fcntl(fd, F_SETPIPE_SZ, n)`
fails with EPERM (as past `pipe-max-size`), x32 system calls and those of another architecture (i386
through `int 0x80`) fail with ENOSYS; everything else is allowed. It is classic BPF, built here as bytes
(eight per instruction: code u16, jt u8, jf u8, k u32, native order) and handed to bubblewrap's
`--seccomp FD`, which loads it before the sandbox's first process runs; every process of the session
inherits it. bubblewrap sets no_new_privs either way, so the filter adds no restriction on setuid programs.

Not here: who applies it (`agentrl.envs.sandbox.shell.Shell`). Apptainer sessions get no filter from us (its
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

ARCHES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (0xC000003E, {
        "add_key": 248, "request_key": 249, "keyctl": 250, "inotify_init": 253, "inotify_init1": 294,
        "fanotify_init": 300, "perf_event_open": 298, "bpf": 321, "userfaultfd": 323, "mq_open": 240,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "io_setup": 206, "fcntl": 72}),
    "aarch64": (0xC00000B7, {
        "add_key": 217, "request_key": 218, "keyctl": 219, "inotify_init1": 26, "fanotify_init": 262,
        "perf_event_open": 241, "bpf": 280, "userfaultfd": 282, "mq_open": 180,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "io_setup": 0, "fcntl": 25}),
}
"""Per machine: the audit architecture and the system call numbers the filter names."""
DENIED = ("add_key", "request_key", "keyctl", "inotify_init", "inotify_init1", "fanotify_init", "perf_event_open",
          "bpf", "userfaultfd", "mq_open", "io_uring_setup", "io_uring_enter", "io_uring_register", "io_setup")


class SeccompUnavailable(RuntimeError):
    """No filter is known for this machine's architecture."""


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def seccomp_filter(machine: str | None = None) -> bytes:
    """The session's filter as a classic BPF program (module docstring) for `machine` (default: this one's)."""
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


def run_filter(program: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """What `program` returns for one system call: a small classic-BPF interpreter for the instructions the
    filter uses (the tests check the filter with it, beside the kernel's own verdict in a sandbox)."""
    data = struct.pack("=iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    insns = [struct.unpack_from("=HBBI", program, i) for i in range(0, len(program), 8)]
    pc = acc = 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == LD_W_ABS:
            acc = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif code in (JEQ_K, JGE_K):
            hit = acc == k if code == JEQ_K else acc >= k
            pc += 1 + (jt if hit else jf)
        elif code == RET_K:
            return k
        else:
            raise ValueError(f"unknown instruction {code:#x}")
