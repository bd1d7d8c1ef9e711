"""The program that runs inside each `os` sandbox as its first process (PID 1 under bubblewrap).

It is not imported by the worker: `agentrl.sandbox.shell` sends this file's source into the sandbox,
where the image's own `/usr/bin/python3 -I -S` runs it, after the source of `view.py`, which
the boot code makes the module `sandbox_view` (the session's tool copies and the graders' views). So
it uses only the standard library and Python 3.9 (`os.waitstatus_to_exitcode`) (Ubuntu 22.04's and
Debian 12's interpreters both run it).

Why a driver and not a shell reading commands: the worker must learn that a command ended, and with
what exit status, through a channel the sandboxed code cannot write to. Here every command is its own
`bash` process, started by the driver, which waits for that process to exit; the driver answers the
worker on its own stdout, which no sandboxed process holds, and makes itself non-dumpable, so that its
`/proc/1/fd` cannot be opened from inside either. As PID 1 of the sandbox's PID namespace it ignores
signals sent from inside. Nothing the sandboxed code prints is parsed for control.

The shell's state (working directory, variables, functions, aliases, options) is kept between
commands in a state file that each command's bash sources first and writes back on exit. Background
jobs keep running after their command ended; their later output is read and dropped, so it never
lands in another command's output, and they do not die of a broken pipe.

Protocol (over stdin/stdout, one JSON object per line; the worker sends first):
  * a decimal length and newline, then a config object (limits, environment, seed length, and "caps":
    the capabilities the bounding set keeps, where root has some), then the
    seed: a tar archive unpacked over `/` (the writable copies of the image's /etc, /var, ...); the
    config's "copies" ([source, destination] directories) are then copied in (/usr/bin, /usr/sbin);
  * answer: {"ready": true} or {"error": "..."} (e.g. a resource limit that could not be set);
  * requests: {"op": "run", "cmd", "timeout"} runs a command in the persistent shell state (stdout
    and stderr together); {"op": "exec", "argv", "timeout", "stderr", "freeze"} runs a program outside
    that state, in /root with the fixed environment (stdout only unless "stderr"); with "freeze" every
    other process of the sandbox is stopped (SIGSTOP) while it runs, so that nothing the agent left
    running can touch a grader; with "view" (default) in its own mount namespace whose /usr is the
    image's, read-only (`enter_view`; the config's "view" says what it is made of). Answer: {"exit",
    "output" (base64), "timed_out", "truncated"}.

Capabilities: with "caps" the bounding set keeps only those (the session's root's), and inheritable
and ambient sets none beyond; the driver itself keeps "admin" (CAP_SYS_ADMIN of the sandbox's user
namespace) in its effective set, which no process it execs can hold, to make the graders' views.
"""
import base64
import ctypes
import io
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import tarfile
import time

from sandbox_proc import REFRESH_S, ProcView
from sandbox_view import MS_NOSUID, Tools, _mount, enter_view, node_id

STATE = "/run/agentrl-shell/state"
LIMITS = {"nproc": resource.RLIMIT_NPROC, "as": resource.RLIMIT_AS, "fsize": resource.RLIMIT_FSIZE,
          "nofile": resource.RLIMIT_NOFILE, "cpu": resource.RLIMIT_CPU}

# Each command's bash: restore the state, run the command, write the state back on exit (also on `exit`).
# It is a plain `bash` reading this one compound command from a pipe (so `ps` inside shows `bash`, as
# for AgentBench's interactive shell); its first act points stdin at /dev/null, so the command reads
# nothing, and after the group bash reads EOF and exits.
# The command arrives in $__AR_CMD and is unset before it runs. Variables of bash itself are not saved.
# Saving and restoring use builtins only: they work in a sandbox whose process limit is full.
WRAPPER = r"""{
exec </dev/null
__ar_cmd=$__AR_CMD; unset __AR_CMD
if [ -r "$__AR_STATE" ]; then . "$__AR_STATE" 2>/dev/null; fi
cd -- "${__AR_CWD:-$HOME}" 2>/dev/null || cd -- "$HOME"
__ar_save() {
  local __ar_v __ar_vs __ar_keep=()
  compgen -v > "$__AR_STATE.vars" && mapfile -t __ar_vs < "$__AR_STATE.vars"
  for __ar_v in "${__ar_vs[@]}"; do
    case $__ar_v in
      BASH|BASH_*|BASHOPTS|BASHPID|COMP_*|COLUMNS|DIRSTACK|EPOCH*|EUID|FUNCNAME|GROUPS|HISTCMD|HOSTNAME|\
HOSTTYPE|LINENO|LINES|MACHTYPE|OPTERR|OPTIND|OSTYPE|PIPESTATUS|PPID|PWD|RANDOM|SECONDS|SHELLOPTS|SHLVL|\
SRANDOM|UID|_|__ar_*|__AR_*) ;;
      *) __ar_keep+=("$__ar_v") ;;
    esac
  done
  {
    declare -p "${__ar_keep[@]}"
    declare -f
    alias -p
    set +o
    shopt -p
    printf '__AR_CWD=%q\n' "$PWD"
    umask -p
  } > "$__AR_STATE" 2>/dev/null
}
trap '__ar_rc=$?; set +xv; __ar_save; exit $__ar_rc' EXIT
shopt -s expand_aliases
eval "unset __ar_cmd"$'\n'"$__ar_cmd"
}
"""


class Driver:
    def __init__(self) -> None:
        self.buf = b""
        self.lingering = []  # output pipes of ended commands whose background jobs still hold them
        self.cfg = {}
        self.wake = -1
        self.state = STATE
        self.tools = None
        self.view = None
        self.proc = None  # the session's own /proc files and sysinfo answers (`sandbox_proc`)

    # ------------------------------------------------------------------------------- worker channel
    def read_exact(self, n):
        out = self.buf[:n]
        self.buf = self.buf[n:]
        while len(out) < n:
            chunk = os.read(0, max(65536, n - len(out)))
            if not chunk:
                raise SystemExit(0)
            out += chunk
        self.buf = out[n:] + self.buf
        return out[:n]

    def read_line(self):
        while b"\n" not in self.buf:
            ready, _, _ = select.select([0] + self.lingering + self.listening(), [], [],
                                        None if self.proc is None else REFRESH_S)
            self.drain_lingering(ready)
            self.serve_proc(ready)
            if 0 in ready:
                chunk = os.read(0, 65536)
                if not chunk:
                    raise SystemExit(0)
                self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    @staticmethod
    def send(obj):
        data = (json.dumps(obj) + "\n").encode()
        while data:
            data = data[os.write(1, data):]

    # ------------------------------------------------------------------------------------- setup
    def setup(self):
        header = int(self.read_line())
        self.cfg = json.loads(self.read_exact(header))
        seed = self.read_exact(int(self.cfg.get("seed_bytes", 0)))
        # Not dumpable: /proc/1/{fd,mem,environ} cannot be opened from inside the sandbox.
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
            return f"prctl(PR_SET_DUMPABLE, 0) failed: errno {ctypes.get_errno()}"
        if "caps" in self.cfg:  # the session's root keeps these (Docker's, or none): no file capability adds another
            keep = set(self.cfg["caps"])
            for cap in range(64):
                if cap not in keep and libc.prctl(24, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:
                    return f"prctl(PR_CAPBSET_DROP, {cap}) failed: errno {ctypes.get_errno()}"  # 22: unknown cap
            error = confine_own_caps(libc, keep, self.cfg.get("admin"))
            if error:
                return error
        if self.cfg.get("ptys"):  # a devpts instance of the session's own, with at most this many ptys
            try:
                own_ptys(int(self.cfg["ptys"]))
            except OSError as e:
                return f"could not bound the session's ptys: {e}"
        for name, value in sorted(self.cfg.get("limits", {}).items()):
            try:
                resource.setrlimit(LIMITS[name], (int(value), int(value)))
            except (ValueError, OSError) as e:
                return f"could not set the {name} limit to {value}: {e}"
            if resource.getrlimit(LIMITS[name]) != (int(value), int(value)):
                return f"the {name} limit did not hold"
        if seed:
            with tarfile.open(fileobj=io.BytesIO(seed)) as tar:
                tar.extractall("/", numeric_owner=True)
        try:  # the session's own /usr/bin, /usr/sbin: root's, writable, over the image's
            self.tools = Tools(self.cfg.get("copies", []), self.cfg.get("links", {}),
                               int(self.cfg.get("tools_room", 0)))
        except (OSError, shutil.Error) as e:
            return f"could not copy the system tools: {e}"
        if self.cfg.get("proc") is not None:  # the session's own meminfo, stat, loadavg, ... and sysinfo(2)
            try:
                self.proc = ProcView(self.cfg["proc"])
                self.proc.mount()
                if self.cfg["proc"].get("sysinfo"):
                    self.proc.listen(os.uname().machine)
            except (OSError, KeyError) as e:
                return f"could not give the session its own /proc view: {e}"
        self.view = self.cfg.get("view")
        if self.view is not None:
            self.view = dict(self.view, local_lib_id=node_id("/usr/local", "lib"))
        self.state = self.cfg.get("state", STATE)
        os.makedirs(os.path.dirname(self.state), exist_ok=True)
        os.chmod(os.path.dirname(self.state), 0o700)
        # A SIGCHLD wakes the select loop through this pipe: a command's end is noticed at once.
        self.wake, wake_w = os.pipe()
        os.set_blocking(self.wake, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        return None

    # ---------------------------------------------------------------------------------- requests
    def serve(self):
        error = self.setup()
        self.send({"error": error} if error else {"ready": True, "pid": os.getpid()})
        if error:
            return
        while True:
            req = json.loads(self.read_line())
            try:  # whatever one request meets (a full file table, text no exec takes), the driver answers
                answer = self.handle(req)
            except Exception as e:  # noqa: BLE001 - the session's own failure, told as its command's result
                answer = failed(f"agentrl: the command could not run: {type(e).__name__}: {e}")
            self.send(answer)

    def handle(self, req):
        self.reap()
        if req["op"] == "run":
            env = dict(self.cfg["env"], __AR_STATE=self.state, __AR_CMD=req["cmd"])
            return self._spawn(["bash"], env, req["timeout"], True, WRAPPER, lambda: oom_first(AGENT_OOM))
        if req["op"] == "exec":
            return self.grader(req)
        return {"error": f"unknown op {req.get('op')!r}"}

    def grader(self, req):
        """An independent program (a grader, an init script): every other process stopped first (with
        "freeze"), the top-level links put back, then the program runs beside an idle shell, in a mount
        namespace of its own whose /usr is the image's, read-only (with "view", the default)."""
        env = dict(self.cfg["check_env"])
        stopped = self.freeze() if req.get("freeze") else []
        try:
            preexec = None
            try:
                if self.tools is not None:
                    self.tools.restore()
                if self.view is not None and req.get("view", True):
                    overrides = self.tools.overrides() if self.tools is not None else []
                    covered = self.tools.covered if self.tools is not None else {}
                    view = self.view
                    preexec = lambda: (oom_first(GRADER_OOM), enter_view(view, covered, overrides))  # noqa: E731
            except OSError as e:  # fail closed: no grader runs over a layout that could not be checked
                return failed(f"agentrl: system tools: {e}")
            # AgentBench's container always holds its interactive `bash`; graders that count
            # processes (`ps -ef | grep bash`) expect it, so an idle one stands in meanwhile.
            try:
                shell = subprocess.Popen(["bash"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, env=env, cwd=self.cfg.get("home", "/root"),
                                         start_new_session=True, close_fds=True,
                                         preexec_fn=lambda: oom_first(AGENT_OOM))
            except OSError:  # the sandbox's process limit is full: the grader's own spawn will say so
                shell = None
            try:
                return self._spawn(req["argv"], env, req["timeout"], bool(req.get("stderr")), None, preexec)
            finally:
                if shell is not None:
                    self.end(shell)
        finally:
            self.thaw(stopped)

    @staticmethod
    def end(shell):
        """Kill and reap a process this driver started."""
        shell.kill()
        shell.stdin.close()
        shell.returncode = -9  # reaped here, or already by reap()
        try:
            os.waitpid(shell.pid, 0)
        except ChildProcessError:
            pass

    def _spawn(self, argv, env, timeout, stderr, script, preexec=None):
        r = w = None
        if self.proc is not None:
            self.proc.refresh(force=True)
        try:  # every resource the start takes is inside: a full file table is the command's failure, not ours
            r, w = os.pipe()
            for attempt in range(10):  # like bash's "fork: retry" when the sandbox's process limit is full
                try:
                    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL if script is None else subprocess.PIPE,
                                            stdout=w,
                                            stderr=w if stderr else subprocess.DEVNULL, env=env,
                                            cwd=self.cfg.get("home", "/root"), start_new_session=True,
                                            close_fds=True, preexec_fn=preexec)
                    break
                except BlockingIOError:
                    if attempt == 9:
                        raise
                    time.sleep(0.1 * (attempt + 1))
        except subprocess.SubprocessError as e:  # the grader's view could not be made: fail closed
            close_all(r, w)
            return failed(f"agentrl: grader view: {e}")
        except (OSError, ValueError) as e:  # ENFILE, EMFILE, EAGAIN, ...; ValueError: text no exec can take
            close_all(r, w)
            return {"exit": 127, "output": base64.b64encode(f"agentrl: could not start: {e}".encode()).decode(),
                    "timed_out": False, "truncated": False}
        os.close(w)
        if script is not None:  # smaller than a pipe's buffer: never blocks
            try:
                proc.stdin.write(script.encode())
                proc.stdin.close()
            except OSError:  # bash already gone: its exit status says why
                pass
        out, truncated, timed_out, pipe_open = bytearray(), False, False, True
        cap = int(self.cfg.get("max_output", 1 << 20))
        deadline = time.monotonic() + float(timeout)
        while True:
            status = self.reap(proc.pid)
            if status is not None:
                break
            left = deadline - time.monotonic()
            if left <= 0:  # the command and everything in its process group
                timed_out = True
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                status = os.waitstatus_to_exitcode(os.waitpid(proc.pid, 0)[1])
                break
            fds = [self.wake] + self.lingering + ([r] if pipe_open else []) + self.listening()
            ready, _, _ = select.select(fds, [], [], left if self.proc is None else min(left, REFRESH_S))
            if self.wake in ready:
                self.drain(self.wake)
            self.drain_lingering(ready)
            self.serve_proc(ready)
            if pipe_open and r in ready:
                chunk = os.read(r, 65536)
                pipe_open = bool(chunk)
                truncated = self.keep(out, chunk, cap) or truncated
        proc.returncode = status  # reaped here, not by subprocess
        if pipe_open:  # what the command wrote before it ended; background jobs may hold the pipe on
            os.set_blocking(r, False)
            while True:
                try:
                    chunk = os.read(r, 65536)
                except BlockingIOError:
                    break
                if not chunk:
                    pipe_open = False
                    break
                truncated = self.keep(out, chunk, cap) or truncated
        if pipe_open:
            self.lingering.append(r)
        else:
            os.close(r)
        code = None if timed_out else status
        if code is not None and code < 0:
            code = 128 - code  # killed by a signal: the shell's convention
        return {"exit": code, "output": base64.b64encode(bytes(out)).decode(), "timed_out": timed_out,
                "truncated": truncated}

    def listening(self):
        return [self.proc.listener] if self.proc is not None and self.proc.listener >= 0 else []

    def serve_proc(self, ready):
        """Answer a trapped sysinfo(2), and rewrite the session's /proc files when they are due."""
        if self.proc is None:
            return
        if self.proc.listener in ready:
            self.proc.answer()
        self.proc.refresh()

    @staticmethod
    def keep(out, chunk, cap):
        room = cap - len(out)
        out += chunk[:max(room, 0)]
        return len(chunk) > room

    def drain_lingering(self, ready):
        for fd in [f for f in self.lingering if f in ready]:
            try:
                if not os.read(fd, 65536):
                    self.lingering.remove(fd)
                    os.close(fd)
            except BlockingIOError:
                pass

    @staticmethod
    def drain(fd):
        try:
            while os.read(fd, 4096):
                pass
        except BlockingIOError:
            pass

    def reap(self, pid=None):
        """Reap every ended child (orphans are re-parented to PID 1); the exit code of `pid` if it ended."""
        found = None
        while True:
            try:
                child, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return found
            if child == 0:
                return found
            if child == pid:
                found = os.waitstatus_to_exitcode(status)

    # ------------------------------------------------------------------------------ freeze/thaw
    @staticmethod
    def freeze():
        """Stop every other process of the sandbox; repeat until a pass finds none new."""
        keep = {os.getpid(), os.getppid(), 1}
        stopped = []
        for _ in range(50):
            new = 0
            for name in os.listdir("/proc"):
                if not name.isdigit() or int(name) in keep or int(name) in stopped:
                    continue
                try:
                    os.kill(int(name), signal.SIGSTOP)
                    stopped.append(int(name))
                    new += 1
                except OSError:
                    pass
            if not new:
                break
        return stopped

    @staticmethod
    def thaw(stopped):
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def confine_own_caps(libc, keep, admin):
    """After the bounding set was cut to `keep`: no inheritable or ambient capability outside it either,
    so that nothing this driver execs holds another; the driver keeps `admin` (CAP_SYS_ADMIN, for the
    graders' views) in its own effective set, and the start fails if it does not hold it."""
    if libc.prctl(47, 4, 0, 0, 0) != 0 and ctypes.get_errno() != 22:  # PR_CAP_AMBIENT_CLEAR_ALL
        return f"prctl(PR_CAP_AMBIENT_CLEAR_ALL) failed: errno {ctypes.get_errno()}"
    header, data = CapHeader(0x20080522, 0), (CapData * 2)()  # _LINUX_CAPABILITY_VERSION_3
    if libc.capget(ctypes.byref(header), data) != 0:
        return f"capget failed: errno {ctypes.get_errno()}"
    for word in range(2):
        mask = sum(1 << (c - 32 * word) for c in keep if 32 * word <= c < 32 * (word + 1))
        data[word].inheritable &= mask
    if libc.capset(ctypes.byref(header), data) != 0:
        return f"capset failed: errno {ctypes.get_errno()}"
    if admin is not None and not data[admin // 32].effective >> (admin % 32) & 1:
        return f"the driver lacks capability {admin}, which the graders' read-only view of /usr needs"
    return None


AGENT_OOM, GRADER_OOM = 1000, 500
"""oom_score_adj of the session's commands (and all they start) and of graders: when the session's cgroup
is full, the kernel kills the agent's processes first, then a grader, and the driver (0) last, so a
memory hog ends its own processes, not the session as an env_error. Raising it needs no privilege; no
session process can lower it again (that takes CAP_SYS_RESOURCE of the host)."""


def oom_first(score):
    """Mark this (forked, not yet exec'd) process to be killed before the driver when memory runs out."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(score))
    except OSError:  # no /proc here (the unsandboxed backend): the cgroup limit still holds
        pass


def close_all(*fds):
    for fd in fds:
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


MS_NOEXEC = 8
DEVPTS_OPTIONS = "newinstance,ptmxmode=0666,mode=620"  # bubblewrap's own for its --dev


def own_ptys(limit):
    """Mount a devpts instance of the session's own over /dev/pts, with at most `limit` ptys: bubblewrap's
    has no maximum, and the kernel's count of ptys outside the host's instance is host-wide
    (`kernel.pty.nr`), so one session could take them all. /dev/ptmx links to pts/ptmx."""
    libc = ctypes.CDLL(None, use_errno=True)
    _mount(libc, "devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, f"{DEVPTS_OPTIONS},max={int(limit)}")


def failed(message):
    """A grader that could not run as it must: exit 126, never a pass."""
    return {"exit": 126, "output": base64.b64encode(message.encode()).decode(), "timed_out": False, "truncated": False}


if __name__ == "__main__":
    Driver().serve()
