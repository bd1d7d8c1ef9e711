"""What sessions could share through the kernel (issue 34, 6) and what they leave behind (issue 34, 8):
the seccomp filter (checked by a small BPF interpreter and by the kernel in a real sandbox), a uid range per
live session, and cgroups removed after a kill, whatever was left in them.

Checked to fail without the fixes: without the filter one session's 200 inotify instances took the
host's last ones (errno 24 for the next session and for the host), a key added in one session showed in
/proc/keys of the next; with one uid range for all sessions a session holding 1,100 pipes shrank every
new pipe of the others to 8 KB; the old `remove` gave up after 2 s on a cgroup that still held a process."""
from __future__ import annotations

import ctypes
import errno
import os
import subprocess
import time

import pytest
from sandbox_helpers import require_sandbox

from agentrl.envs.sandbox import SandboxConfig, SandboxError, Shell, cgroup_support, cgroups
from agentrl.envs.sandbox.seccomp import ARCHES, DENIED, F_SETPIPE_SZ, RET_ALLOW, RET_ERRNO, run_filter, seccomp_filter


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
        if nr not in {numbers[n] for n in DENIED if n in numbers} | {fcntl}:
            assert run_filter(program, nr, arch) == RET_ALLOW, nr
    assert run_filter(program, 0, 0x40000003) == enosys  # another architecture (i386 through int 0x80)
    if machine == "x86_64":
        assert run_filter(program, 0x40000000 + 1, arch) == enosys  # the x32 ABI
    assert len(program) % 8 == 0 and len(program) // 8 < 64


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
    hog, other = Shell(fast(), uid_slot=0), Shell(fast(), uid_slot=1)
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

    monkeypatch.setattr("agentrl.envs.sandbox.shell.SessionCgroup", refuse)
    with pytest.raises(SandboxError, match="does not start without its limits"):
        Shell(fast())
