"""Sessions in processes of their own: task code that can hold the interpreter lock or eat memory never
runs in the worker's event-loop process.

Why: a tool that runs Python in the worker's process (a BFCL backend's `power(10, 14758103)`, a SQL
statement that builds 16 MB values row after row, any task author's tool) can hold the interpreter lock
for seconds or take the process's memory; the worker's heartbeats stop, the controller declares it dead,
and every session on it ends as env_error. A thread cannot be stopped; a process can.

How: at start the worker forks one *zygote* (`SessionHost`), a single-threaded copy of itself holding the
built tasks; each session of a task whose `isolation` is "process" (the default; `isolation_of`) is a
process forked from the zygote (a few milliseconds, its pages shared with the zygote until written). The
worker talks to it over a socket pair, one length-prefixed JSON frame per request and answer
(`ProcessSession`: the interface of `agentrl.serving.session.Session`). Each session process:
  * may grow its address space by at most `memory_mb` (RLIMIT_AS over its size at fork), and SQLite's
    heap in it by half of that (`PRAGMA hard_heap_limit`, which is process-wide: here, session-wide):
    a memory bomb fails inside its own session (MemoryError: `agent_fault`);
  * handles each message under the message budget (`agentrl.tasks.api.message_budget`), and is killed
    when it has not answered `kill_after_s` after the message was sent: the agent's budget ran out, so
    the episode ends as the agent's failure (`over_budget`: invalid_action, reward 0);
  * dies with its zygote, which dies with the worker (the end of its control socket).
A session process that dies while handling a message is the agent's failure when it died of a signal
its own work raised (SIGSEGV, SIGABRT, ...: the message crashed native code), the environment's
(env_error) when it was killed from outside (SIGKILL not sent by us: the host's OOM killer, an operator)
or exited on its own. Starting a sample, the expert's move and closing are the environment's work: a
failure there is env_error.

Tasks with `isolation = "thread"` run in the worker's thread pool as before: tasks whose work already
runs elsewhere (`os`: a sandbox; `db` on MariaDB: the server) or is trivially bounded (`lookup`), and
tasks whose sessions share state held in the task object (a live-sandbox count) that separate processes
would each copy.

Not here: the worker's routes (`agentrl.serving.worker`), the budgets' meaning (`agentrl.serving.session`).
"""
from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import gc
import json
import logging
import os
import re
import resource
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from agentrl.serving.session import MAX_OUTPUT_CHARS, MESSAGE_BUDGET_S, Session, ToolBox, agent_fault, over_budget
from agentrl.serving.wire_types import InteractResult, cut
from agentrl.tasks.api import EnvError, Task
from agentrl.types import Status

log = logging.getLogger(__name__)

ISOLATIONS = ("process", "thread")
FRAME = struct.Struct("!Q")
MAX_FRAME = 64 << 20
"""The largest answer a session process may send (its observations are cut far below this)."""
DEFAULT_MEMORY_MB = 1024
FATAL_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGILL,
                           signal.SIGSYS, signal.SIGXCPU})
"""Signals a process raises on itself by what it runs: a session process dying of one while handling the
agent's message crashed on that message."""
PR_SET_PDEATHSIG = 1


def isolation_of(task: Task) -> str:
    """"process" (the default) or "thread": where the worker runs `task`'s sessions (module docstring)."""
    value = getattr(task, "isolation", "process")
    if value not in ISOLATIONS:
        raise ValueError(f"task {getattr(task, 'name', task)!r}: isolation must be one of {ISOLATIONS}, not {value!r}")
    return str(value)


# ------------------------------------------------------------------------------------------ framing

def send_frame(sock: socket.socket, obj: Any) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(FRAME.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes | None:
    """`n` bytes, None at EOF; TimeoutError past `deadline` (monotonic; inf: wait)."""
    chunks, got = [], 0
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        ready, _, _ = select.select([sock], [], [], None if left == float("inf") else left)
        if not ready:
            continue
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket, deadline: float = float("inf")) -> Any:
    """The next frame's object; None at EOF. TimeoutError past `deadline`, ValueError on a bad frame."""
    head = _recv_exact(sock, FRAME.size, deadline)
    if head is None:
        return None
    (size,) = FRAME.unpack(head)
    if size > MAX_FRAME:
        raise ValueError(f"a frame of {size} bytes (limit {MAX_FRAME})")
    body = _recv_exact(sock, size, deadline)
    if body is None:
        return None
    return json.loads(body)


# ---------------------------------------------------------------------------------- the session process

def _address_space() -> int:
    """This process's virtual size in bytes (0 where unknown)."""
    try:
        with open("/proc/self/status") as f:
            found = re.search(r"^VmSize:\s+(\d+) kB", f.read(), re.M)
    except OSError:
        return 0
    return int(found.group(1)) << 10 if found else 0


def _bound_memory(memory_mb: int) -> None:
    """At most `memory_mb` more address space for this process; SQLite's heap at most half of that."""
    if memory_mb <= 0:
        return
    limit = _address_space() + (memory_mb << 20)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard if hard != resource.RLIM_INFINITY else limit))
    if "sqlite3" in sys.modules:  # process-wide in SQLite, so set only here, where the process is the session's
        import sqlite3

        conn = sqlite3.connect(":memory:")
        conn.execute(f"PRAGMA hard_heap_limit = {(memory_mb << 20) // 2}")
        conn.close()


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _serve_session(sock: socket.socket, task: Task, toolbox: ToolBox, settings: dict[str, Any]) -> None:
    """One session's process: answer the worker's requests until it closes the session."""
    session: Session | None = None
    while True:
        try:
            request = recv_frame(sock)
        except (OSError, ValueError):
            return
        if request is None:
            break
        op = request.get("op")
        if op == "close":
            break
        try:
            if op == "start":
                session = Session(task, str(request["index"]), toolbox, settings["max_output_chars"],
                                  settings["message_budget_s"])
                reply: dict[str, Any] = {"messages": session.messages, "tools": session.tools}
            elif session is None:
                reply = EnvError("bad_request", "the session has not started").to_wire()
            elif op == "interact":
                reply = {"result": session.interact(request.get("message")).to_wire()}
            else:  # expert
                reply = {"message": session.expert_message()}
        except EnvError as e:
            reply = e.to_wire()
        except BaseException as e:  # noqa: BLE001 - whatever the task raised, the worker gets an answer
            reply = {"fault": "agent" if op == "interact" and agent_fault(e) else "env",
                     "error": f"{type(e).__name__}: {cut(str(e))}"}
        try:
            send_frame(sock, reply)
        except (TypeError, ValueError) as e:  # an answer that is not JSON: the task's bug
            send_frame(sock, {"fault": "env", "error": f"the task's answer is not JSON ({cut(str(e))})"})
        except OSError:
            return
    if session is not None:
        session.close()
    with contextlib.suppress(OSError):
        send_frame(sock, {"ok": True})


def _session_main(sock: socket.socket, task: Task, toolbox: ToolBox, settings: dict[str, Any]) -> None:
    _die_with_parent()
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)  # a group of its own: whatever a tool starts goes with the session (`ProcessSession.kill`)
    faulthandler.disable()  # a crash here is the agent's input's doing, told by the worker (not a traceback)
    try:
        _bound_memory(int(settings["memory_mb"]))
        _serve_session(sock, task, toolbox, settings)
    except BaseException:  # noqa: BLE001 - nothing may unwind into the zygote's code
        with contextlib.suppress(Exception):
            log.exception("session process of %s failed", getattr(task, "name", "?"))
    finally:
        os._exit(0)  # never run the worker's atexit handlers or finalizers of objects inherited from it


# ------------------------------------------------------------------------------------------ the zygote

def _zygote(ctl: socket.socket, tasks: Mapping[str, tuple[Task, ToolBox]], settings: dict[str, Any]) -> None:
    """Fork a session process per request on `ctl` until the worker closes it; then kill them all.

    The zygote and its sessions ignore the signals a job's processes get together (Slurm's SIGTERM to the
    step, the terminal's SIGINT, the warning signals): a draining worker finishes its sessions, and they go
    when it goes (the end of `ctl` here, PR_SET_PDEATHSIG there)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, signal.SIG_IGN)
    with contextlib.suppress(OSError, ValueError):
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    with contextlib.suppress(ValueError, OSError):
        signal.set_wakeup_fd(-1)  # the worker's event loop's, which is not ours to write
    gc.freeze()  # what the worker built stays shared: the collector never writes to those pages
    live: set[int] = set()
    ended: OrderedDict[int, int] = OrderedDict()
    warmed: set[tuple[str, str]] = set()

    def reap() -> None:
        while live:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                live.clear()
                return
            if pid == 0:
                return
            live.discard(pid)
            ended[pid] = status
            while len(ended) > 4096:
                ended.popitem(last=False)

    while True:
        ready, _, _ = select.select([ctl], [], [], 1.0)
        reap()
        if not ready:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(ctl, 1 << 16, 1)
        except OSError:
            break
        if not data:
            break
        request = json.loads(data)
        answer: dict[str, Any] = {"id": request.get("id")}
        if request["op"] == "spawn":
            name, index = request["task"], str(request["index"])
            task, toolbox = tasks[name]
            split = index.rpartition("-")[0]
            if (name, split) not in warmed:  # a split's data loaded once here, shared by every session after
                warmed.add((name, split))
                with contextlib.suppress(Exception):
                    task.indices(split)
            pid = os.fork()
            if pid == 0:
                ctl.close()
                _session_main(socket.socket(fileno=fds[0]), task, toolbox, settings)
            os.close(fds[0])
            live.add(pid)
            answer["pid"] = pid
        elif request["op"] == "status":
            pid, deadline = int(request["pid"]), time.monotonic() + float(request.get("wait_s", 1.0))
            while pid in live and time.monotonic() < deadline:
                time.sleep(0.01)
                reap()
            answer["status"] = ended.get(pid)
        ctl.send(json.dumps(answer).encode())
    for pid in live:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


class SessionHost:
    """The worker's zygote: forked now (before the worker serves anything), it forks session processes.

    Args:
        tasks: name -> (task, its toolbox) for the tasks whose sessions run in processes.
        memory_mb: how much each session process may grow (RLIMIT_AS over its size at fork).
        max_output_chars, message_budget_s: the `Session` settings of the worker.
    """

    def __init__(self, tasks: Mapping[str, tuple[Task, ToolBox]], memory_mb: int = DEFAULT_MEMORY_MB,
                 max_output_chars: int = MAX_OUTPUT_CHARS, message_budget_s: float = MESSAGE_BUDGET_S) -> None:
        settings = {"memory_mb": memory_mb, "max_output_chars": max_output_chars,
                    "message_budget_s": message_budget_s}
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            try:
                ours.close()
                _zygote(theirs, dict(tasks), settings)
            finally:
                os._exit(0)
        theirs.close()
        self.pid = pid
        self.ctl = ours
        self.lock = threading.Lock()
        self.closed = False
        self.asked = 0

    def _ask(self, request: dict[str, Any], fds: list[int] | None = None, timeout_s: float = 30.0) -> dict[str, Any]:
        """The zygote's answer to `request` (one at a time; answers to requests that timed out earlier are
        skipped by their id)."""
        with self.lock:
            if self.closed:
                raise EnvError("env_error", "the worker's session host is closed")
            self.asked += 1
            request = {**request, "id": self.asked}
            socket.send_fds(self.ctl, [json.dumps(request).encode()], fds or [])
            deadline = time.monotonic() + timeout_s
            while (left := deadline - time.monotonic()) > 0:
                ready, _, _ = select.select([self.ctl], [], [], left)
                data = self.ctl.recv(1 << 16) if ready else b""
                if ready and not data:
                    break  # the zygote is gone
                if data and (answer := json.loads(data)).get("id") == self.asked:
                    return dict(answer)
        raise EnvError("env_error", f"the worker's session host did not answer {request['op']}")

    def spawn(self, task: str, index: str) -> tuple[int, socket.socket]:
        """A new session process for `task`: its pid and the worker's end of its socket."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            answer = self._ask({"op": "spawn", "task": task, "index": index}, [theirs.fileno()])
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return int(answer["pid"]), ours

    def exit_status(self, pid: int, wait_s: float = 1.0) -> int | None:
        """The wait status of a session process that ended (None: still running or unknown)."""
        try:
            status = self._ask({"op": "status", "pid": pid, "wait_s": wait_s}, timeout_s=wait_s + 5.0)["status"]
        except (EnvError, OSError):
            return None
        return None if status is None else int(status)

    def close(self) -> None:
        """Stop the zygote; it kills the session processes still alive. Idempotent."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self.ctl.close()
        for _ in range(100):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(self.pid, os.WNOHANG)[0] != 0:
                    return
            time.sleep(0.01)
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)


# ------------------------------------------------------------------------------ the worker's handle

class ProcessSession:
    """A session whose episode runs in a process of its own; the interface of `Session` for the worker.

    Args:
        host: the worker's zygote.
        task, index: what to start (raises EnvError as `Session` does; env_error when the process fails).
        kill_after_s: a message not answered this long after it was sent has its process killed.
        start_timeout_s: the same for the start, the expert's move and closing (the environment's work).
        message_budget_s: the budget the process gives each message (named in the observation).
    """

    def __init__(self, host: SessionHost, task: Task, index: str, kill_after_s: float, start_timeout_s: float,
                 message_budget_s: float = MESSAGE_BUDGET_S) -> None:
        self.task = task
        self.host = host
        self.kill_after_s = kill_after_s
        self.start_timeout_s = start_timeout_s
        self.message_budget_s = message_budget_s
        self.done = False
        self.killed = False
        self.pid, self.sock = host.spawn(task.name, index)
        self.pidfd = -1
        with contextlib.suppress(OSError, AttributeError):
            self.pidfd = os.pidfd_open(self.pid)
        try:
            reply = self._call({"op": "start", "index": index}, start_timeout_s, "start")
        except BaseException:
            self.close()
            raise
        self.messages: list[dict[str, Any]] = list(reply["messages"])
        self.tools: list[dict[str, Any]] = list(reply["tools"])

    def _call(self, request: dict[str, Any], timeout_s: float, what: str) -> dict[str, Any]:
        """Send a request that is the environment's work and return the answer; EnvError otherwise."""
        try:
            send_frame(self.sock, request)
            reply = recv_frame(self.sock, time.monotonic() + timeout_s)
        except TimeoutError:
            self.kill()
            raise EnvError("env_error", f"{self.task.name}: the session process did not answer {what} within "
                                        f"{timeout_s:g} s") from None
        except (OSError, ValueError) as e:
            self.kill()
            raise EnvError("env_error", f"{self.task.name}: the session process failed ({e})") from None
        if reply is None:
            raise EnvError("env_error", f"{self.task.name}: the session process ended during {what} "
                                        f"({self._death()})")
        if "fault" in reply:
            raise EnvError("env_error", f"{self.task.name}: {what} failed: {reply['error']}")
        if "error" in reply:
            raise EnvError.from_wire(reply, 0)
        return reply

    def interact(self, message: Any) -> InteractResult:
        if self.done:
            raise EnvError("bad_request", "the episode has already ended")
        try:
            send_frame(self.sock, {"op": "interact", "message": message})
            reply = recv_frame(self.sock, time.monotonic() + self.kill_after_s)
        except TimeoutError:
            self.kill()
            return self._end(over_budget(f"its work ran past the message budget of {self.message_budget_s:g} s "
                                         "and was stopped"))
        except (OSError, ValueError) as e:  # the process is gone or sent garbage: not the agent's message
            self.kill()
            why = f"{self.task.name}: the session process failed ({e})"
            return self._end(InteractResult.ended(Status.ENV_ERROR, why))
        if reply is None:
            return self._end(self._died_on_message())
        if reply.get("fault") == "agent":
            return self._end(over_budget(str(reply["error"])))
        if reply.get("fault") == "env":
            return self._end(InteractResult.ended(Status.ENV_ERROR, f"{self.task.name}: {reply['error']}"))
        if "error" in reply:
            raise EnvError.from_wire(reply, 0)
        result = InteractResult.from_wire(reply["result"])
        if result.done:
            self._end(result)
        return result

    def _died_on_message(self) -> InteractResult:
        status = self.host.exit_status(self.pid)
        if status is not None and os.WIFSIGNALED(status) and os.WTERMSIG(status) in FATAL_SIGNALS:
            why = f"it crashed the session's process ({signal.Signals(os.WTERMSIG(status)).name})"
            log.info("%s: a message crashed its session process: %s", self.task.name, why)
            return over_budget(why)
        reason = f"{self.task.name}: the session process ended while handling a message ({_describe(status)})"
        log.warning("%s", reason)
        return InteractResult.ended(Status.ENV_ERROR, reason)

    def _death(self) -> str:
        return _describe(self.host.exit_status(self.pid))

    def _end(self, result: InteractResult) -> InteractResult:
        self.done = True
        self.close()
        return result

    def expert_message(self) -> dict[str, Any]:
        message: dict[str, Any] = self._call({"op": "expert"}, self.start_timeout_s, "the expert's move")["message"]
        return message

    def kill(self) -> None:
        """Kill the session's process at once (its episode's resources go with it)."""
        if self.killed:
            return
        self.killed = True
        try:
            if self.pidfd >= 0:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)
        except (ProcessLookupError, OSError):
            pass
        with contextlib.suppress(ProcessLookupError, OSError):
            os.killpg(self.pid, signal.SIGKILL)  # what its tools started (the session is the group's leader)

    def close(self) -> None:
        """End the session: its process closes the episode and exits (killed if it does not). Idempotent."""
        if self.sock.fileno() < 0:
            return
        if not self.killed:
            try:
                send_frame(self.sock, {"op": "close"})
                recv_frame(self.sock, time.monotonic() + self.start_timeout_s)
            except (OSError, ValueError, TimeoutError):
                pass
            self.kill()  # gone already, or would not go
        self.sock.close()
        if self.pidfd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = -1

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def _describe(status: int | None) -> str:
    if status is None:
        return "exit status unknown"
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"
