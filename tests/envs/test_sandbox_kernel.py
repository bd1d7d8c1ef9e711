"""What sessions could share through the kernel and what they leave behind:
the seccomp filter (checked by a small BPF interpreter and by the kernel in a real sandbox), a uid range per
live session, and cgroups removed after a kill, whatever was left in them.

Checked to fail without the fixes: without the filter one session's 200 inotify instances took the
host's last ones (errno 24 for the next session and for the host), a key added in one session showed in
/proc/keys of the next; with one uid range for all sessions a session holding 1,100 pipes shrank every
new pipe of the others to 8 KB; the old `remove` gave up after 2 s on a cgroup that still held a process."""
from __future__ import annotations

import base64
import ctypes
import errno
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from sandbox_helpers import require_sandbox, run_filter

from agentrl.checks.attacks.channels import PARKER, PROC_SNAPSHOT, parse_snapshot
from agentrl.sandbox import SandboxConfig, SandboxError, Shell, cgroup_support, cgroups
from agentrl.sandbox import config as sandbox_config
from agentrl.sandbox import shell as sandbox_shell
from agentrl.sandbox.config import budgets, check_slots, session_budget
from agentrl.sandbox.seccomp import ARCHES, DENIED, F_SETPIPE_SZ, RET_ALLOW, RET_ERRNO, SET_UIDS, seccomp_filter
from agentrl.sandbox.shell import exec_text


def fast(**kw: object) -> SandboxConfig:
    return SandboxConfig(backend="bwrap", command_timeout_s=float(kw.pop("timeout", 10.0)), **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------- the filter

@pytest.mark.parametrize("machine", sorted(ARCHES))
def test_the_filter_refuses_shared_kernel_objects_and_nothing_else(machine: str) -> None:
    arch, numbers = ARCHES[machine]
    program = seccomp_filter(machine)
    enosys, eperm = RET_ERRNO | errno.ENOSYS, RET_ERRNO | errno.EPERM
    for name in DENIED:
        if name in numbers:
            assert run_filter(program, numbers[name], arch) == enosys, name
    fcntl = numbers["fcntl"]
    assert run_filter(program, fcntl, arch, (3, F_SETPIPE_SZ, 1 << 20)) == eperm
    assert run_filter(program, fcntl, arch, (3, F_SETPIPE_SZ + 1, 0)) == RET_ALLOW  # F_GETPIPE_SZ and the rest
    for nr in range(0, 460):  # every other call of the architecture is allowed
        if nr not in {numbers[n] for n in DENIED if n in numbers} | {fcntl}:  # (set*uid to root among them)
            assert run_filter(program, nr, arch) == RET_ALLOW, nr
    unchanged = 0xFFFFFFFF
    for name in SET_UIDS:  # a real uid of root, nobody or the first 8 users; any effective or saved one
        nr = numbers[name]
        for uid, verdict in ((0, RET_ALLOW), (1000, RET_ALLOW), (1007, RET_ALLOW), (65534, RET_ALLOW),
                             (unchanged, RET_ALLOW), (1, eperm), (999, eperm), (1008, eperm), (65533, eperm),
                             (65535, eperm), (1 << 31, eperm), ((1 << 32) + 1000, RET_ALLOW)):
            assert run_filter(program, nr, arch, (uid, 5, 5)) == verdict, (name, uid)
        assert run_filter(program, nr, arch, (unchanged, 4242, 4242)) == RET_ALLOW  # seteuid(4242)
    assert run_filter(seccomp_filter(machine, user_uids=0), numbers["setuid"], arch, (1000,)) == eperm
    assert run_filter(program, 0, 0x40000003) == enosys  # another architecture (i386 through int 0x80)
    if machine == "x86_64":
        assert run_filter(program, 0x40000000 + 1, arch) == enosys  # the x32 ABI
    assert len(program) % 8 == 0 and len(program) // 8 < 128


PROBE = r"""cat > /tmp/probe.py <<'EOF'
import ctypes, errno, fcntl, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
fds = [libc.inotify_init1(0) for _ in range(200)]
print("inotify", sum(fd >= 0 for fd in fds), errno.errorcode.get(ctypes.get_errno()), flush=True)
if sys.argv[1:] == ["hold"]:
    time.sleep(60)
r = libc.syscall(248, b"user", b"agentrl-probe", b"secret", 6, ctypes.c_int(-4))  # add_key to the user keyring
print("add_key", r, errno.errorcode.get(ctypes.get_errno()))
_, w = os.pipe()
try:
    fcntl.fcntl(w, 1031, 1 << 20)
    print("grown", fcntl.fcntl(w, 1032))
except OSError as e:
    print("grown", errno.errorcode[e.errno])
EOF
(python3 /tmp/probe.py hold > /tmp/held &); python3 /tmp/probe.py; sleep 0.5; cat /tmp/held"""


def test_a_session_reaches_no_shared_kernel_object(tmp_path: object) -> None:
    require_sandbox()
    if os.uname().machine != "x86_64":
        pytest.skip("the probe's add_key number is x86_64's")
    a, b = Shell(fast()), Shell(fast(), uid_slot=1)
    try:
        out = a.run(PROBE).output
        assert "inotify 0 ENOSYS" in out and "add_key -1 ENOSYS" in out and "grown EPERM" in out, out
        assert "agentrl-probe" not in b.run("cat /proc/keys 2>&1; echo done").output
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(0)  # the host still has its own
        assert fd >= 0, os.strerror(ctypes.get_errno())
        os.close(fd)
        r = b.run("tail -f /etc/hostname & sleep 0.5; kill %1; echo done")  # a tool that wants inotify falls back
        assert "agentrl-sandbox" in r.output and "done" in r.output, r.output
    finally:
        a.close()
        b.close()


HOG = ("(python3 -c \"import os, time\nps = [os.pipe() for _ in range(1100)]\nprint('held', flush=True)\n"
       "time.sleep(60)\" &); sleep 1; echo started")
PIPE_SIZE = "python3 -c \"import os, fcntl; r, w = os.pipe(); print(fcntl.fcntl(w, 1032))\""


def test_a_session_does_not_shrink_the_pipes_of_another() -> None:
    """The kernel counts pipe pages per host uid (pipe-user-pages-soft): live sessions of a root worker map
    to uid ranges of their own, so one holding 1,100 pipes shrinks only its own new pipes."""
    require_sandbox()
    if not SandboxConfig().many_uids("bwrap"):
        pytest.skip("a root worker maps a uid range per session; this one is not root")
    soft = int(open("/proc/sys/fs/pipe-user-pages-soft").read())
    if soft == 0 or soft > 1100 * 16:
        pytest.skip(f"pipe-user-pages-soft is {soft}: 1,100 pipes do not pass it")
    hog, other = Shell(fast(open_files=4096), uid_slot=0), Shell(fast(), uid_slot=1)  # 2,200 descriptors
    try:
        assert "started" in hog.run(HOG).output
        assert hog.run(PIPE_SIZE).output.strip() != "65536"  # the hog's own new pipes are shrunk
        assert other.run(PIPE_SIZE).output.strip() == "65536"
    finally:
        hog.close()
        other.close()


# ------------------------------------------------------------------------------------------- cgroups

def cgroups_here() -> None:
    if cgroup_support().kind is None:
        pytest.skip(f"this worker may not make cgroups: {cgroup_support().reason}")


def test_a_cgroup_is_removed_after_killing_what_is_left_in_it() -> None:
    """On 5d8debb `remove` waited 2 s for the processes to go and gave up (a session that made a million
    directories takes longer to die); now it kills what is left, waits, and removes child groups first."""
    cgroups_here()
    group = cgroups.SessionCgroup(cgroup_support(), "agentrl-test", 64 << 20, 16)
    proc = subprocess.Popen(["sleep", "300"], preexec_fn=group.join_self)
    try:
        sub = group.dirs[-1] / "child"
        sub.mkdir()  # a child group (a session may not make one; removal copes all the same)
        t = time.monotonic()
        group.remove(wait_s=10.0)
        assert time.monotonic() - t < 5.0 and not any(d.exists() for d in group.dirs)
        assert proc.wait(timeout=5) == -9
    finally:
        proc.kill()
        proc.wait()


def test_a_cgroup_that_cannot_be_removed_goes_to_the_reaper(monkeypatch: pytest.MonkeyPatch) -> None:
    cgroups_here()
    group = cgroups.SessionCgroup(cgroup_support(), "agentrl-test", 64 << 20, 16)
    real = cgroups._remove_tree
    monkeypatch.setattr(cgroups, "_remove_tree", lambda dirs, deadline: list(dirs))  # busy, as if still dying
    monkeypatch.setattr(cgroups._reaper, "_run", lambda: None)
    with pytest.raises(OSError, match="background reaper keeps removing it"):
        group.remove(wait_s=0.1)
    assert cgroups.pending() >= 1
    assert real(group.dirs, time.monotonic() + 5.0) == []
    cgroups._reaper.queue.clear()


def test_no_session_starts_without_its_cgroup(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where this worker makes cgroups, a session whose cgroup cannot be made (the host ran out of them) does
    not start: on 5d8debb it started without any limit, with a warning."""
    require_sandbox()
    cgroups_here()

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("agentrl.sandbox.shell.SessionCgroup", refuse)
    with pytest.raises(SandboxError, match="does not start without its limits"):
        Shell(fast())


# ------------------------------------------------------------- host-wide tables: each session its share

COUNTERS = ("/proc/sys/fs/aio-nr", "/proc/sys/fs/file-nr", "/proc/sys/fs/inode-nr", "/proc/sys/fs/dentry-state",
            "/proc/sys/kernel/pty/nr", "/proc/locks")
TABLES = r"""python3 - <<'EOF'
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
ctx = ctypes.c_ulong(0)
print("io_setup", libc.syscall(206, 65536, ctypes.byref(ctx)), errno.errorcode.get(ctypes.get_errno()))
ptys = []
while True:
    try:
        ptys.append(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
    except OSError as e:
        print("ptys", len(ptys), errno.errorcode[e.errno])
        break
libc.shmget(0, 1 << 20, 0o1600)  # IPC_PRIVATE | IPC_CREAT: a SysV segment, in the session's IPC namespace
EOF
"""


def test_a_session_holds_only_its_share_of_host_wide_tables() -> None:
    """AIO contexts are refused; a session's ptys stop at `ptys` and the next session still gets its own;
    the open files a session's processes may hold are within its share of fs.file-max; SysV IPC is the
    session's own; the host's counts of those objects read as nothing. Before: one session's io_setup took
    all 65,536 AIO events, 3,071 ptys took the host's last, and aio-nr, pty/nr, file-nr were readable."""
    require_sandbox()
    if os.uname().machine != "x86_64":
        pytest.skip("the probe's io_setup number is x86_64's")
    cfg = fast(ptys=8)
    a, b = Shell(cfg), Shell(cfg, uid_slot=1)
    try:
        out = a.run(TABLES).output
        assert "io_setup -1 ENOSYS" in out and "ptys 8 ENOSPC" in out, out
        assert "ptys 8 ENOSPC" in b.run(TABLES).output  # the other session's are its own
        assert b.run("cat /proc/sysvipc/shm | wc -l").output.strip() == "2"  # a header, and b's own segment
        for path in COUNTERS:
            if os.path.exists(path):
                r = b.run(f"cat {path} 2>/dev/null | wc -c")
                assert r.output.strip() == "0", (path, r.output)
        nofile = int(a.run("ulimit -n").output)
        assert nofile == cfg.nofile() and nofile * cfg.processes() <= sandbox_config.file_share(cfg)
    finally:
        a.close()
        b.close()


def test_budgets_hand_computed() -> None:
    cfg = SandboxConfig(nproc=64, pid_fraction=0.5, host_share=0.5, ptys=16, user_uids=8)
    # pids 32768 * 0.5 / 64 = 256; ptys 3072 * 0.5 // 16 = 96; files: 72 processes and 10 uids' files in
    # flight hold 1,024 each, and each uid 253 more (one message past its limit):
    # 10,000,000 * 0.5 // (82 * 1024 + 10 * 253 = 86,498) = 57
    assert {k: n for k, (n, _) in budgets(cfg, 32768, 10_000_000, 3072).items()} == {"pids": 256, "files": 57,
                                                                                     "ptys": 96}
    assert session_budget(cfg, 32768, 10_000_000, 3072) == 57
    # open files: 5,000,000 // 57 = 87,719 per session, less 2,530 for the uids' last messages, over 82 holders
    assert cfg.nofile(host_file_max=10_000_000) == min(cfg.nofile(host_file_max=1 << 40), 1038)
    assert 72 * 1038 + 10 * (1038 + 253) <= 5_000_000 // 57
    with pytest.raises(ValueError, match="58 sandbox slots exceed this host's files budget"):
        check_slots(cfg, 58, 32768, 10_000_000, 3072)
    with pytest.raises(ValueError, match="97 sandbox slots exceed this host's ptys budget"):
        check_slots(SandboxConfig(open_files=16), 97, 32768, 10_000_000, 3072)


def driver_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """driver.py as the sandbox runs it, imported here: `sandbox_view` is view.py, `sandbox_proc` procview.py."""
    for name, source in (("sandbox_view", sandbox_shell.VIEW_SOURCE), ("sandbox_proc", sandbox_shell.PROC_SOURCE)):
        module = types.ModuleType(name)
        exec(compile(Path(source).read_text(), name, "exec"), module.__dict__)
        monkeypatch.setitem(sys.modules, name, module)
    module = types.ModuleType("sandbox_driver")
    exec(compile(Path(sandbox_shell.DRIVER_SOURCE).read_text(), "sandbox_driver", "exec"), module.__dict__)
    return module


@pytest.mark.parametrize("code", [errno.ENFILE, errno.EMFILE])
def test_the_driver_survives_a_full_file_table(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    """No descriptor left for a command's output pipe (the host's file table full, ENFILE, or the driver's
    own, EMFILE) is that command's failure, an observation. Before: `os.pipe()` outside the `try` raised,
    the driver exited, and the session ended as env_error ("the sandbox's driver exited")."""
    driver = driver_module(monkeypatch)

    def full() -> tuple[int, int]:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(driver.os, "pipe", full)
    answer = driver.Driver()._spawn(["true"], {}, 5, True, None)
    assert answer["exit"] == 127 and os.strerror(code) in base64.b64decode(answer["output"]).decode()


def test_the_driver_answers_whatever_a_request_holds() -> None:
    """Text no program can take, sent to the driver as it is (past `exec_text`), is the command's failure:
    the driver answers and goes on. Before: "\ud800" ended it."""
    require_sandbox()
    shell = Shell(fast())
    try:
        r = shell._request({"op": "run", "cmd": "echo \ud800"}, 5.0)
        assert r.exit_code == 127 and "agentrl: could not start" in r.output, r
        assert shell.run("echo alive").output == "alive\n"
    finally:
        shell.close()


def test_any_text_is_a_command() -> None:
    """NULs and unpaired surrogates reach the shell as text (U+FFFD where a surrogate has no byte of its
    own); before, "echo \\ud800" ended the driver ("the sandbox's driver exited")."""
    assert exec_text("a\0b\ud800c\udcff") == "ab\ufffdc\udcff" and exec_text("plain") == "plain"
    require_sandbox()
    shell = Shell(fast())
    try:
        assert shell.run("echo \ud800 x\0y").output == "\ufffd xy\n"
        assert shell.run_independent(["echo", "\udfff"]).output == "\ufffd\n"
        assert shell.run("echo alive").output == "alive\n"
    finally:
        shell.close()


# ----------------------------------------------------------- what one session can read of another's work

MODULATE = ("(python3 -c \"import os, time\nb = bytearray(300 << 20)\nps = [os.pipe() for _ in range(400)]\n"
            "for _ in range(40):\n    if os.fork() == 0:\n        time.sleep(60)\n        os._exit(0)\n"
            "t = time.time()\nwhile time.time() < t + 3: pass\ntime.sleep(60)\" &); sleep 4; echo started")


def _snapshot(shell: Shell) -> tuple[list[int], dict[str, str]]:
    return parse_snapshot(shell.run(PROC_SNAPSHOT, timeout=60).output)


def test_a_session_reads_nothing_of_another_sessions_work() -> None:
    """Every file of /proc outside the session's own processes reads the same while another session forks 40
    processes, holds 300 MB and 800 pipes and burns CPU (and the host runs what it runs); meminfo, loadavg
    and sysinfo(2) count the session's own memory and processes only. Before, /proc/meminfo, stat, loadavg,
    uptime's idle, vmstat, interrupts, softirqs, diskstats, buddyinfo, zoneinfo, pressure/*, fs/ext4/*
    and sysinfo's procs and freeram all moved with it (a channel between sessions)."""
    require_sandbox()
    cfg = fast(timeout=60.0)
    a, b = Shell(cfg), Shell(cfg, uid_slot=1)
    try:
        own, before = _snapshot(b)
        assert len(before) > 100, before  # /proc/sys and the static descriptions are still there
        assert "started" in a.run(MODULATE, timeout=30).output
        own_after, after = _snapshot(b)
        moved = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
        assert not moved, moved
        total, used, tasks, sys_total, sys_used, procs = own_after
        assert total == sys_total == cfg.session_memory_mb << 20 if b.cgroup is not None else total > 0
        assert used < 200 << 20 and sys_used < 200 << 20, own_after  # a holds 300 MB more than that
        assert tasks < 20 and procs < 20, own_after  # a's 41 processes are not counted
        ps = b.run("ps -e --no-headers | wc -l; free -m | head -2; uptime; nproc").output
        assert int(ps.split()[0]) < 10 and "Mem:" in ps and "load average" in ps, ps
    finally:
        a.close()
        b.close()


def test_files_parked_in_unix_sockets_stay_within_the_sessions_share() -> None:
    """Files passed over a Unix socket and not received are held by no process: the kernel bounds them per real
    uid (at most the sender's RLIMIT_NOFILE, `too_many_unix_fds`). Before, a session's root could become any of
    its 65,536 uids and park 1,000 files under each (5 uids: 5,000 measured; all of them: past the host's
    table); now only root, nobody and `user_uids` users can be taken, and the budget counts each as a holder."""
    require_sandbox()
    if not SandboxConfig().many_uids("bwrap"):
        pytest.skip("a root worker maps a uid range per session; this one is not root")
    cfg = fast(timeout=60.0)
    shell = Shell(cfg)
    try:
        out = shell.run(PARKER + "python3 /tmp/p.py; su nobody -s /bin/sh -c id; useradd -m jack && su - jack -c id; "
                        "su daemon -s /bin/sh -c id", timeout=60).output
    finally:
        shell.close()
    parked = int(out.split("parked ")[1].split()[0])
    uids = cfg.user_uids + 2  # root, nobody, 1000..1007: 10 of the 19 the parker tries
    assert uids * 1000 <= parked <= uids * (cfg.nofile() + sandbox_config.SCM_MAX_FD), out
    assert cfg.processes() * cfg.nofile() + parked <= sandbox_config.file_share(cfg)
    assert "uid=65534(nobody)" in out and "uid=1000(jack)" in out, out  # what the tasks do still works
    assert "cannot set user id" in out, out  # daemon (1): not a uid a session may become
