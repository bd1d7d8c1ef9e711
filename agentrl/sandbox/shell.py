"""One sandbox session (`Shell`), and the environments its commands and graders get.

What is here (`agentrl.sandbox` lists the package's other modules): the environments commands and
graders get (`BASE_ENV`, `CHECK_ENV`, `python_argv`), and `Shell`: one session. Its first process is a
small driver (`driver.py`, run by the image's own python3) that starts each command as its own bash
process, waits for it, and answers the worker on a channel nothing inside can write to; the shell's state
(working directory, variables, functions) carries over between commands through a state file, background
jobs keep running. `run` is the agent's shell; `run_independent` runs init and check scripts in /root with
a fixed environment, stdout only, in a mount namespace of their own whose /usr is the image's, read-only
(graders; under bubblewrap), and can stop every other process of the sandbox while it runs (graders the
policy cannot touch).

Isolation with bubblewrap: new user, PID, network (loopback only), IPC, UTS and mount namespaces. The
root is a tmpfs of `disk_mb` (everything a session writes lives there, bounded); the image's system
directories (`/usr/*`, `/var/lib`, `/var/cache`) are bound read-only from the image built by `python -m
jobs.make_rootfs` (`agentrl.sandbox.rootfs`); writable copies of its `/etc`, `/var/log`, ... are unpacked
into the tmpfs at start, and (`writable_bin`) of `/usr/bin` and `/usr/sbin`, which the driver mounts
over the image's own (a grader's view takes them off again: graders run the image's). Nothing of the
host's file system is visible. Files of `/etc` that decide which code a trusted interpreter runs (the
dynamic loader's configuration, python's site configuration, `alternatives`) stay read-only. `/dev/shm`
is a tmpfs of its own (`shm_mb`); `/dev` is read-only. Resource limits (processes, memory, file size,
open files, CPU time) are set by the driver for the whole sandbox; if one cannot be set the session does
not start. RLIMIT_NPROC counts the processes of the sandbox's own user namespace, so a fork bomb
exhausts its own session; the kernel never applies it to the host's root, so a root worker's sandboxes
run as unprivileged host uids (`uid_base`..., or `host_uid` with one id).

User ids: a root worker maps `uid_count` ids (host uids from `uid_base`) into each bubblewrap sandbox
through `userns.py`, which also bars further user namespaces and keeps one process budget for
all of them; root there has Docker's default capabilities (`DOCKER_CAPS`), nothing more in its bounding
set. A worker that is not root gets bubblewrap's own namespace: uid 0 only, without capabilities
(`chown` to another user fails). Apptainer's `--fakeroot` maps a range. Not here: task logic
(`agentrl.tasks.os_task`).
"""
from __future__ import annotations

import base64
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from agentrl.sandbox import cgroups
from agentrl.sandbox.cgroups import SessionCgroup
from agentrl.sandbox.config import (
    CGROUP_EXTRA_PIDS,
    SandboxConfig,
    SandboxError,
    apptainer_binary,
    check_cgroups,
    check_image,
    select_backend,
)
from agentrl.sandbox.layout import (
    COPIED_BIN,
    DOCKER_CAPS,
    DRIVER_CAPS,
    apptainer_argv,
    bwrap_argv,
    grader_view,
    plan_mounts,
    seed_archive,
    top_links,
)
from agentrl.sandbox.seccomp import SeccompUnavailable, filter_fd, seccomp_filter

log = logging.getLogger(__name__)

DRIVER_SOURCE = Path(__file__).with_name("driver.py")
VIEW_SOURCE = Path(__file__).with_name("view.py")
PROC_SOURCE = Path(__file__).with_name("procview.py")
USERNS_LAUNCHER = Path(__file__).with_name("userns.py")
# Reads length-prefixed sources from stdin ("<length> <module>\n" + source each): each but the last becomes
# the module it names; the last, the driver, runs as __main__. Keeps the command line short.
BOOT = ("import os,sys,types\ndef r(n):\n b=b''\n while len(b)<n:\n  c=os.read(0,n-len(b))\n"
        "  if not c: raise SystemExit(1)\n  b+=c\n return b\nwhile True:\n h=b''\n"
        " while not h.endswith(b'\\n'): h+=r(1)\n n,name=h.decode().split()\n m=types.ModuleType(name)\n"
        " exec(compile(r(int(n)),'agentrl-'+name,'exec'),m.__dict__)\n if name=='__main__': break\n"
        " sys.modules[name]=m\n")


# ------------------------------------------------------------------------------------ the environment

BASE_ENV: dict[str, str] = {
    "HOME": "/root", "USER": "root", "LOGNAME": "root", "SHELL": "/bin/bash", "TERM": "xterm",
    "LANG": "C.UTF-8", "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
}
CHECK_ENV: dict[str, str] = {
    **BASE_ENV,
    # The image's read-only directories first: nothing the agent puts in /usr/local/bin shadows them.
    "PATH": "/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/sbin:/usr/local/bin",
    # No code from /root (python's cwd entry, user site-packages) runs inside a grader's python3.
    "PYTHONSAFEPATH": "1", "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1",
}
TRUSTED_PYTHON = ["/usr/bin/python3", "-I", "-S"]
"""The image's interpreter, isolated (no PYTHON* variables, no cwd or user site on sys.path) and without
`site` (no .pth file or sitecustomize runs, wherever the agent could write one). Under bubblewrap the
session's /usr/bin is its own copy; a grader's /usr is a read-only view of the image instead
(`view.enter_view`, run by the driver), so this path and its start-up files (pyvenv.cfg, ._pth) are the image's."""
# `python3 -c CODE ARGS...` without `site`: `site` is what defines exit()/quit(), which AgentBench's check
# scripts call; the prelude puts them back and runs CODE with sys.argv as `python3 -c` would set it.
PYTHON_PRELUDE = ("import builtins, sys\nbuiltins.exit = builtins.quit = sys.exit\ncode = sys.argv.pop(1)\n"
                  "exec(compile(code, '<string>', 'exec'), {'__name__': '__main__', '__builtins__': builtins})\n")


def python_argv(code: str, params: list[str]) -> list[str]:
    """A python script as a grader runs it: `TRUSTED_PYTHON` with the prelude; sys.argv[1:] == params."""
    return [*TRUSTED_PYTHON, "-c", PYTHON_PRELUDE, code, *params]


def exec_text(text: str) -> str:
    """`text` as it can reach a program (an environment variable, argv): without NULs, which cannot travel
    there (nor in a tty), and with each unpaired surrogate that has no byte of its own replaced by U+FFFD.
    The sandbox's python encodes text with `surrogateescape`: U+DC80..U+DCFF stand for the bytes 0x80..0xFF
    (kept); U+D800 has no byte, and once ended the driver. Any text a client sends is a command here."""
    text = text.replace("\0", "")
    try:
        text.encode("utf-8", "surrogateescape")
        return text
    except UnicodeEncodeError:
        return "".join("\ufffd" if "\ud800" <= c <= "\udfff" and not "\udc80" <= c <= "\udcff" else c for c in text)


# ------------------------------------------------------------------------------------------- the shell

@dataclass
class CommandResult:
    """What one command left: its output, exit status (None when it timed out), and how it ended."""

    output: str
    exit_code: int | None
    timed_out: bool = False
    truncated: bool = False


class Shell:
    """One session's sandbox. Not thread-safe: one command at a time (the worker serializes a session).

    Raises SandboxError when the sandbox does not start (a limit that cannot be set included) or its
    driver dies; `close()` kills every process of the sandbox and is idempotent.

    uid_slot: which of the root worker's uid ranges this session's ids map to (`SandboxConfig.uid_range`):
        live sessions of different slots share no host uid, so nothing the kernel counts or keeps per uid
        (pipe pages, keys, process counts) is shared between them.
    """

    def __init__(self, cfg: SandboxConfig | None = None, uid_slot: int = 0) -> None:
        self.cfg = cfg or SandboxConfig()
        self.backend = select_backend(self.cfg.backend, self.cfg.isolation)
        check_image(self.cfg, self.backend)
        self.uid_base = self.cfg.uid_range(uid_slot)
        self.uid = self.cfg.sandbox_uid(self.backend)
        if self.uid is not None and self.cfg.many_uids(self.backend):
            self.uid = self.uid_base
        self.closed = False
        self.cgroup: SessionCgroup | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._buf = b""
        self._dir: Path | None = None
        self._memory_fds: tuple[int, ...] = ()
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def argv(self, seccomp_fd: int | None = None) -> list[str]:
        """The command line that starts this session's sandbox (bubblewrap: its seccomp filter read from
        `seccomp_fd`)."""
        command = [*TRUSTED_PYTHON, "-c", BOOT]
        if self.backend == "bwrap":
            image = str(self.cfg.image_dir().absolute())
            many = self.cfg.many_uids(self.backend)
            argv = bwrap_argv(plan_mounts(image, self.cfg.disk_mb), command, self.cfg.hostname,
                              self.cfg.disk_mb, self.cfg.shm_mb, in_userns=many, seccomp_fd=seccomp_fd)
            if many:
                launch = {"base": self.uid_base, "count": self.cfg.uid_count, "nproc": self.cfg.nproc,
                          "nofile": self.cfg.nofile()}
                argv[0] = shutil.which("bwrap") or "/usr/bin/bwrap"
                return [sys.executable, "-I", "-S", str(USERNS_LAUNCHER), json.dumps(launch), "--", *argv]
            return argv
        if self.backend == "apptainer":
            return apptainer_argv(self.cfg.image, {}, {}, command, self.cfg.hostname, self.cfg.fakeroot,
                                  apptainer_binary() or "apptainer")
        return ["python3", "-I", "-S", "-c", BOOT]

    def _driver_config(self) -> tuple[dict[str, object], bytes]:
        c = self.cfg
        limits = {"nproc": c.nproc, "as": c.memory_mb << 20, "fsize": c.file_size_mb << 20,
                  "nofile": c.nofile(), "cpu": c.cpu_s}
        cfg: dict[str, object] = {"env": BASE_ENV, "check_env": CHECK_ENV, "max_output": c.max_output_bytes,
                                  "limits": limits, "home": "/root"}
        if self.backend == "bwrap":  # the bounding set the driver keeps for the session's root
            cfg["caps"] = sorted(DOCKER_CAPS.values()) if c.many_uids(self.backend) else []
            cfg["admin"] = DRIVER_CAPS["CAP_SYS_ADMIN"]
            cfg["ptys"] = c.ptys
            cfg["proc"] = {"memory": (c.session_memory_mb if self.cgroup is not None else c.memory_mb) << 20,
                           "usage": self._memory_fds[0] if self._memory_fds else None,
                           "stat": self._memory_fds[1] if self._memory_fds else None, "sysinfo": c.seccomp}
        seed = b""
        if self.backend == "bwrap":
            seed = seed_archive(str(self.cfg.image_dir().absolute()))
            image = self.cfg.image_dir().absolute()
            cfg["links"] = top_links(image)
            if c.writable_bin:
                cfg["copies"] = [f"/usr/{d}" for d in COPIED_BIN if (image / "usr" / d).is_dir()]
                cfg["tools_room"] = c.disk_mb << 20
            cfg["view"] = grader_view(image)
        elif self.backend == "none":  # unsandboxed: keep HOME and the state inside the session directory
            self._dir = Path(tempfile.mkdtemp(prefix="agentrl-sbx-", dir=c.work_dir or None))
            home = str(self._dir)
            cfg.update(home=home, state=f"{home}/.agentrl-state", limits={},
                       env={**BASE_ENV, "HOME": home}, check_env={**CHECK_ENV, "HOME": home})
        cfg["seed_bytes"] = len(seed)
        return cfg, seed

    def _start(self) -> None:
        support = check_cgroups(self.cfg, self.backend)
        if support is not None:
            try:
                self.cgroup = SessionCgroup(support, "agentrl-session", self.cfg.session_memory_mb << 20,
                                            self.cfg.nproc + CGROUP_EXTRA_PIDS)
            except OSError as e:
                # This worker makes cgroups (probed at start), so a failure now is the host running out of
                # them (sessions that left theirs behind: `cgroups.pending()`): a session must not start
                # without its limits. It fails to start (env_error); a worker failing every start reports
                # the task unhealthy and the controller sends its sessions elsewhere.
                raise SandboxError(f"could not make the session's cgroup ({e}; {cgroups.pending()} cgroups of "
                                   f"ended sessions are still being removed): the session does not start "
                                   f"without its limits") from e
        uid = self.uid if self.uid is not None and not self.cfg.many_uids(self.backend) else None
        cgroup = self.cgroup

        def enter() -> None:  # in the child, before exec: the whole sandbox starts inside its cgroup
            if cgroup is not None:
                cgroup.join_self()
            if uid is not None:  # the launcher maps the ids itself (many_uids); here: one unprivileged uid
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)

        self._stderr = tempfile.TemporaryFile()
        seccomp = self._seccomp_fd()
        # the session's cgroup memory files, read by the driver for the session's own /proc/meminfo
        self._memory_fds = (tuple(os.open(p, os.O_RDONLY) for p in cgroup.memory_files)
                            if cgroup is not None and self.backend == "bwrap" else ())
        try:
            self._proc = subprocess.Popen(self.argv(seccomp), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=self._stderr, start_new_session=True, cwd="/",
                                          env={"PATH": BASE_ENV["PATH"], "LANG": "C.UTF-8"},
                                          pass_fds=(() if seccomp is None else (seccomp,)) + self._memory_fds,
                                          preexec_fn=enter if cgroup is not None or uid is not None else None)
        finally:
            for fd in (() if seccomp is None else (seccomp,)) + self._memory_fds:
                os.close(fd)
        cfg, seed = self._driver_config()
        view, proc, source = VIEW_SOURCE.read_bytes(), PROC_SOURCE.read_bytes(), DRIVER_SOURCE.read_bytes()
        header = json.dumps(cfg).encode()
        try:
            self._write(b"%d sandbox_view\n" % len(view) + view + b"%d sandbox_proc\n" % len(proc) + proc
                        + b"%d __main__\n" % len(source) + source
                        + b"%d\n" % len(header) + header + seed)
            answer = self._answer(time.monotonic() + max(30.0, self.cfg.command_timeout_s))
        except SandboxError as e:
            message = f"the {self.backend} sandbox did not start: {e}; {self._stderr_tail()}"
            log.error("%s", message)
            raise SandboxError(message) from e
        if "error" in answer:
            log.error("os sandbox refused to start: %s", answer["error"])
            raise SandboxError(f"the {self.backend} sandbox did not start: {answer['error']}")

    def _seccomp_fd(self) -> int | None:
        """bubblewrap: a descriptor holding the session's seccomp filter (`seccomp`), None without one."""
        if self.backend != "bwrap" or not self.cfg.seccomp:
            return None
        try:
            return filter_fd(seccomp_filter(user_uids=self.cfg.user_uids))
        except SeccompUnavailable as e:
            raise SandboxError(f"{e}; set sandbox.seccomp to false to run sessions without the filter") from e

    def _stderr_tail(self) -> str:
        try:
            self._stderr.seek(0)
            return self._stderr.read()[-500:].decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""

    def _write(self, data: bytes) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None:
            raise SandboxError("the sandbox is not running")
        try:
            proc.stdin.write(data)
            proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise SandboxError(f"the sandbox's driver is gone ({type(e).__name__})") from e

    def _answer(self, deadline: float) -> dict[str, object]:
        """The driver's next answer line, or SandboxError when it died or passed `deadline`."""
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        fd = proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SandboxError("the sandbox's driver did not answer in time")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise SandboxError("the sandbox's driver exited")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        answer: dict[str, object] = json.loads(line)
        return answer

    def _request(self, request: dict[str, object], timeout: float) -> CommandResult:
        if self.closed:
            raise RuntimeError("the sandbox is closed")
        self._write(json.dumps({**request, "timeout": timeout}).encode() + b"\n")
        try:
            answer = self._answer(time.monotonic() + timeout + 15.0)  # the driver enforces `timeout`
        except SandboxError:
            log.error("os sandbox failed: %s", self._stderr_tail())
            self.close()
            raise
        if "error" in answer:
            raise SandboxError(str(answer["error"]))
        output = base64.b64decode(str(answer["output"])).decode("utf-8", errors="replace")
        code = answer["exit"]
        return CommandResult(output, None if code is None else int(str(code)), bool(answer["timed_out"]),
                             bool(answer["truncated"]))

    # ---------------------------------------------------------------------------------- commands
    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        """Run `command` in the session's shell (stdout and stderr together; state carries over)."""
        return self._request({"op": "run", "cmd": exec_text(command)},
                             self.cfg.command_timeout_s if timeout is None else timeout)

    def run_independent(self, argv: list[str], timeout: float | None = None, stderr: bool = False,
                        freeze: bool = False, view: bool = True) -> CommandResult:
        """Run a program outside the shell's state: cwd /root, the fixed check environment, stdout only
        (unless `stderr`); with `freeze`, every other process of the sandbox is stopped meanwhile; with
        `view` (bubblewrap), in its own mount namespace whose /usr is the image's, read-only (graders);
        without, in the session's own (a sample's init script, which may write its /usr/bin)."""
        argv = [exec_text(a) for a in argv]
        return self._request({"op": "exec", "argv": argv, "stderr": stderr, "freeze": freeze, "view": view},
                             self.cfg.command_timeout_s if timeout is None else timeout)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # bwrap's --die-with-parent takes the PID namespace with it
            except (ProcessLookupError, PermissionError):
                pass
            for stream in (proc.stdin, proc.stdout):
                try:
                    if stream:
                        stream.close()
                except OSError:
                    pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
        stderr = getattr(self, "_stderr", None)
        if stderr is not None:
            stderr.close()
        cgroup, self.cgroup = getattr(self, "cgroup", None), None
        if cgroup is not None:
            try:
                cgroup.remove()
            except OSError as e:
                log.warning("could not remove the session's cgroup %s: %s", cgroup.name, e)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def __del__(self) -> None:  # a forgotten session must not leave a sandbox running
        try:
            self.close()
        except Exception:
            pass
