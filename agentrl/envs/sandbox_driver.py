"""The program that runs inside each `os` sandbox as its first process (PID 1 under bubblewrap).

It is not imported by the worker: `agentrl.envs.sandbox` sends this file's source into the sandbox,
where the image's own `/usr/bin/python3 -I -S` runs it. So it uses only the standard library and
Python 3.9 (`os.waitstatus_to_exitcode`) (Ubuntu 22.04's and Debian 12's interpreters both run it).

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
    running can touch a grader. Answer: {"exit", "output" (base64), "timed_out", "truncated"}.
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
import stat
import subprocess
import tarfile
import time

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
            ready, _, _ = select.select([0] + self.lingering, [], [])
            self.drain_lingering(ready)
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
        if "caps" in self.cfg:  # root with Docker's capabilities: no file capability may add another
            keep = set(self.cfg["caps"])
            for cap in range(64):
                if cap not in keep and libc.prctl(24, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:
                    return f"prctl(PR_CAPBSET_DROP, {cap}) failed: errno {ctypes.get_errno()}"  # 22: unknown cap
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
        try:  # the session's own /usr/bin, /usr/sbin: root's, writable
            self.tools = Tools(self.cfg.get("copies", []), self.cfg.get("links", {}))
        except (OSError, shutil.Error) as e:
            return f"could not copy the system tools: {e}"
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
            self.reap()
            if req["op"] == "run":
                env = dict(self.cfg["env"], __AR_STATE=self.state, __AR_CMD=req["cmd"])
                self.send(self._spawn(["bash"], env, req["timeout"], True, WRAPPER))
            elif req["op"] == "exec":
                self.send(self.grader(req))
            else:
                self.send({"error": f"unknown op {req.get('op')!r}"})

    def grader(self, req):
        """An independent program (a grader, an init script): every other process stopped first (with
        "freeze"), then the image's tools put back, then the program runs beside an idle shell."""
        env = dict(self.cfg["check_env"])
        stopped = self.freeze() if req.get("freeze") else []
        try:
            if self.tools is not None:
                try:
                    self.tools.restore()
                except OSError as e:  # fail closed: no grader runs over tools that could not be checked
                    return {"exit": 126, "output": base64.b64encode(f"agentrl: system tools: {e}".encode()).decode(),
                            "timed_out": False, "truncated": False}
            # AgentBench's container always holds its interactive `bash`; graders that count
            # processes (`ps -ef | grep bash`) expect it, so an idle one stands in meanwhile.
            try:
                shell = subprocess.Popen(["bash"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, env=env, cwd=self.cfg.get("home", "/root"),
                                         start_new_session=True, close_fds=True)
            except OSError:  # the sandbox's process limit is full: the grader's own spawn will say so
                shell = None
            try:
                return self._spawn(req["argv"], env, req["timeout"], bool(req.get("stderr")), None)
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

    def _spawn(self, argv, env, timeout, stderr, script):
        r, w = os.pipe()
        try:
            for attempt in range(10):  # like bash's "fork: retry" when the sandbox's process limit is full
                try:
                    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL if script is None else subprocess.PIPE,
                                            stdout=w,
                                            stderr=w if stderr else subprocess.DEVNULL, env=env,
                                            cwd=self.cfg.get("home", "/root"), start_new_session=True,
                                            close_fds=True)
                    break
                except BlockingIOError:
                    if attempt == 9:
                        raise
                    time.sleep(0.1 * (attempt + 1))
        except OSError as e:
            os.close(r)
            os.close(w)
            return {"exit": 127, "output": base64.b64encode(str(e).encode()).decode(), "timed_out": False,
                    "truncated": False}
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
            fds = [self.wake] + self.lingering + ([r] if pipe_open else [])
            ready, _, _ = select.select(fds, [], [], left)
            if self.wake in ready:
                self.drain(self.wake)
            self.drain_lingering(ready)
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


class Tools:
    """The session's own copies of the image's tool directories, made whole again before each grader.

    `copies`: [pristine, session] directory pairs (/usr/lib/agentrl/bin -> /usr/bin, ...), copied at
    start; `links`: top-level symlinks of the image that must point where they did (/bin -> usr/bin).
    `restore` puts back every name the image has whose content or link target the session changed
    (a chmod or chown alone is kept: test-50's check reads /usr/bin/find's mode), a renamed or replaced
    directory or link, and removes names the image has in another tool directory (a /usr/sbin/grep would
    come first on PATH). Other new files stay. What is untouched since the last look (same inode and
    ctime, which no process can set back) is not read again, so a restore costs a few hundred lstat calls.
    """

    def __init__(self, copies, links):
        self.copies = [(src, dst) for src, dst in copies]
        self.links = dict(links)
        self.pristine = {src: set(os.listdir(src)) for src, _ in self.copies}  # read-only: listed once
        self.names = set().union(*self.pristine.values())
        self.seen = {}
        for src, dst in self.copies:
            shutil.copytree(src, dst, symlinks=True)
            self.seen[dst] = self.snapshot(dst)

    @staticmethod
    def snapshot(d):
        out = {}
        with os.scandir(d) as entries:
            for e in entries:
                st = e.stat(follow_symlinks=False)
                out[e.name] = (st.st_ino, st.st_ctime_ns)
        return out

    def restore(self):
        for src, dst in self.copies:  # its owner may always chmod it back (no capability needed)
            if os.path.isdir(dst) and not os.path.islink(dst):
                os.chmod(dst, os.stat(src).st_mode & 0o7777)
        for path, target in self.links.items():
            if not (os.path.islink(path) and os.readlink(path) == target):
                remove(path)
                os.symlink(target, path)
        for src, dst in self.copies:
            if os.path.islink(dst) or not os.path.isdir(dst):
                remove(dst)
                shutil.copytree(src, dst, symlinks=True)
                self.seen[dst] = self.snapshot(dst)
                continue
            before, now, pristine = self.seen[dst], self.snapshot(dst), self.pristine[src]
            for name in now.keys() | pristine:
                if name in before and now.get(name) == before[name]:
                    continue
                s, d = os.path.join(src, name), os.path.join(dst, name)
                if name not in pristine:
                    if name in self.names:
                        remove(d)
                elif not same(s, d):
                    remove(d)
                    if os.path.islink(s):
                        os.symlink(os.readlink(s), d)
                    else:
                        shutil.copy2(s, d)
            self.seen[dst] = self.snapshot(dst)


def remove(path):
    """Remove whatever is at `path` (a file, a link, a directory tree; nothing is fine)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def same(pristine, path):
    """Whether `path` holds what `pristine` holds: the same link target, or a regular file with the same
    bytes (read here, never a cached answer: a forged size and mtime prove nothing)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if os.path.islink(pristine):
        return stat.S_ISLNK(st.st_mode) and os.readlink(path) == os.readlink(pristine)
    if not stat.S_ISREG(st.st_mode) or st.st_size != os.lstat(pristine).st_size:
        return False
    try:
        with open(pristine, "rb") as a, open(path, "rb") as b:
            while True:
                x, y = a.read(1 << 20), b.read(1 << 20)
                if x != y:
                    return False
                if not x:
                    return True
    except OSError:  # unreadable (a mode of 000 without CAP_DAC_OVERRIDE): replaced, as if changed
        return False


if __name__ == "__main__":
    Driver().serve()
