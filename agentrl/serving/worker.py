"""The env worker: an aiohttp server that hosts the sessions of one or more tasks.

It serves the session routes (start_sample, interact, cancel, expert, indices, status) for the
controller to forward to, plus POST /drain. It holds at most `slots` sessions and refuses new ones
with 503 no_capacity when full or draining; a draining worker still serves the sessions it holds until
they end. Task code runs behind `Session`, so a raising task ends its episode as env_error instead of
crashing the worker. `start_worker` also registers with the controller and heartbeats every
`heartbeat_s`; it re-registers (listing its live sessions) whenever the controller says it does not
know it. Every route requires the run's secret (`agentrl.auth`); /expert answers only where the run
turned it on (`envs.expert_route`).

Faults stay with the session that caused them:
  * a session of a task whose `isolation` is "process" (the default) runs in a process of its own, forked
    from a zygote made at start (`agentrl.serving.isolation`): a tool that holds the interpreter lock or
    eats memory stops only its own session;
  * every task call (to a session process or, for `isolation = "thread"`, to the task itself) runs on
    this worker's own thread pool (`blocking` or not: a session can make a fast task slow), with a thread
    for every slot, so the event loop (and with it the heartbeats) never waits on task work and one slow
    session never queues behind others;
  * a call that outlives `call_timeout_s` (below the controller's request timeout) ends its session as
    env_error with that reason; the thread it holds is counted as taken (`stuck`) until it returns,
    when the session is closed;
  * one call at a time per session: a second interact or expert while one runs gets 409 `busy`.

Expiry belongs to the controller (it hears the client's keep-alives; the worker does not). A session
quiet on the worker for longer than the controller's idle limit is only a candidate: the next heartbeat
lists it, and the worker drops it only if the controller answers that it no longer holds it.

Not here: routing, dead-worker detection (the controller's), process setup and logging config
(`jobs/env_worker.py`), sandboxes (tasks that run untrusted code own theirs).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from agentrl.auth import auth_header
from agentrl.config import ControllerConfig, EnvsConfig
from agentrl.config.task_options import capped_budget_s, worker_call_timeout_s
from agentrl.serving.isolation import ProcessSession, SessionHost, isolation_of
from agentrl.serving.listener import GUARD_KEY, ConnectionGuard, ConnectionLimits, GuardedSite, runner_args
from agentrl.serving.session import (
    Session,
    ToolBox,
)
from agentrl.serving.wire import Handler, auth_middleware, check_exposure, error_response, read_json
from agentrl.serving.wire_types import InteractResult, StartResult, require, shown
from agentrl.tasks.api import EnvError, Task
from agentrl.tasks.json_args import clean_message
from agentrl.types import Status

log = logging.getLogger(__name__)

UNHEALTHY_AFTER = 5
"""Starts of one task failing in a row (none succeeding between) after which the worker reports that task
unhealthy: a worker whose sessions all fail to start (a poisoned process) must not stay a target."""
NOT_A_FAULT = ("bad_request", "unknown_task", "no_capacity", "unauthorized")
"""Refusals of a start that say nothing about the worker's health."""
MAX_ENDED = 10_000
CALL_TIMEOUT_S = worker_call_timeout_s(ControllerConfig())
"""The deadline for one task call of a worker made outside a run (tests, the attack check): a run's default."""
"""Sessions this worker ended itself (a call timed out), remembered so later calls get the reason."""


class CallTimedOut(Exception):
    """A task call did not return within the worker's deadline; its thread still runs."""


@dataclass
class _Live:
    session: Session | ProcessSession
    task: str
    last_used: float
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def task_cap(task: Task, slots: int) -> int:
    """How many sessions of `task` this worker may hold at once: the task's own `session_cap()` (a sandboxing task:
    what the host's pid, file and pty tables allow), else `slots`."""
    cap = getattr(task, "session_cap", None)
    return min(int(cap()), slots) if callable(cap) else slots


class EnvWorker:
    """Sessions of the hosted tasks and the route handlers over them."""

    def __init__(self, tasks: Mapping[str, Task], envs: EnvsConfig, controller: ControllerConfig, worker_id: str, *,
                 expert_route: bool = False, call_timeout_s: float | None = None) -> None:
        """Args:
            tasks: the hosted tasks by name, built already.
            envs, controller: the run's sections this worker reads where it uses them: `envs` its slots, the bounds
                of a call (arguments, tool calls, output), the agent's budget per message and a session process's
                memory; `controller` the deadline for a task call (`worker_call_timeout_s`), request bodies, and
                when a quiet session is asked about (later than the controller expires it, by `dead_after_s`).
            expert_route: answer /expert (the scripted expert's moves).
            call_timeout_s: the deadline for one task call instead of the controller's (tests make it short).
        """
        self.tasks = dict(tasks)
        self.toolboxes = {name: ToolBox(t.tools(), envs.max_argument_bytes, envs.max_tool_calls)
                          for name, t in self.tasks.items()}
        self.call_timeout_s = worker_call_timeout_s(controller) if call_timeout_s is None else call_timeout_s
        # The agent's budget per message lies well inside this worker's deadline for a call: a session
        # process that has not answered by `kill_after_s` is killed (the agent's failure) before the call
        # could time out here (the environment's).
        self.message_budget_s = capped_budget_s(envs.message_budget_s, self.call_timeout_s)
        self.kill_after_s = min(self.message_budget_s + 2.0, 0.9 * self.call_timeout_s)
        isolated = {name: (t, self.toolboxes[name]) for name, t in self.tasks.items()
                    if isolation_of(t) == "process"}
        # forked now, before this worker serves or starts threads: see agentrl.serving.isolation
        self.host = SessionHost(isolated, envs.process_memory_mb, envs.max_output_chars, self.message_budget_s) \
            if isolated else None
        self.isolated = set(isolated)
        self.slots = envs.slots
        self.worker_id = worker_id
        # The controller expires idle sessions and cancels them here; the worker asks about its own quiet
        # ones (later by a margin, so the two rarely cross) only to free slots the controller forgot.
        self.session_idle_s = controller.session_idle_s + controller.dead_after_s
        self.max_output_chars = envs.max_output_chars
        self.expert_route = expert_route
        self.max_body_bytes = controller.max_body_bytes
        self.body_timeout_s = controller.body_timeout_s
        self.draining = False
        self.sessions: dict[str, _Live] = {}
        self.ended: OrderedDict[str, str] = OrderedDict()
        """Sessions ended here (their call timed out) → why, for their later calls."""
        self.starting = 0
        """start_sample calls in flight: they hold a slot until they answer."""
        self.starting_by_task: dict[str, int] = {}
        self.task_caps = {name: cap for name, t in self.tasks.items() if (cap := task_cap(t, self.slots)) < self.slots}
        """Tasks whose sessions the host holds fewer of than this worker's slots (`session_cap`): their starts past
        the cap answer no_capacity (the client waits and retries) while the other tasks use the remaining slots."""
        self.stuck = 0
        """Task calls past their deadline whose threads still run: each holds a slot until it returns."""
        self.counters = {"call_timeouts": 0, "busy": 0, "unhandled": 0, "unauthorized": 0, "failed_starts": 0}
        self.start_failures: dict[str, int] = {}
        """Per task: starts that failed in a row (reset by one that succeeds)."""
        self.last_start_error: dict[str, str] = {}
        # A thread for every slot, and as many again for starts and closes of sessions already gone:
        # a call never waits for a thread because other sessions are slow. Threads start only on demand.
        self.pool = ThreadPoolExecutor(max_workers=2 * self.slots + 4, thread_name_prefix=f"task-{worker_id}")
        self._closing: set[asyncio.Task[None]] = set()
        self.changed = asyncio.Event()
        """Set when the controller should hear from us before the next heartbeat is due (a drain)."""
        self.guard: ConnectionGuard | None = None
        """Its server's connections by state (`create_worker_app` sets it)."""

    # ------------------------------------------------------------------------------------ helpers
    async def _run(self, task: Task, fn: Callable[..., Any], *args: Any,
                   late: Callable[[Future[Any]], None] | None = None) -> Any:
        """Call task code on the pool, bounded by `call_timeout_s`, whatever the task's `blocking` says.

        Even a fast task's call can be made slow by its session (kg's programs once grew exponentially):
        on the event loop it would stop the heartbeats, and the controller would declare the whole worker
        dead. On a timeout the thread keeps running: it counts as `stuck` until it returns, and then
        `late(future)` cleans up what it produced (e.g. closes a session whose caller was already told it
        timed out).
        """
        future = self.pool.submit(fn, *args)
        try:
            async with asyncio.timeout(self.call_timeout_s):
                return await asyncio.shield(asyncio.wrap_future(future))
        except BaseException as e:
            if future.done():  # the task's own exception
                raise
            self.stuck += 1
            loop = asyncio.get_running_loop()

            def returned(f: Future[Any]) -> None:
                self.stuck -= 1
                if late is not None:
                    late(f)

            def from_thread(f: Future[Any]) -> None:
                with contextlib.suppress(RuntimeError):  # the loop closed: the process is exiting
                    loop.call_soon_threadsafe(returned, f)

            future.add_done_callback(from_thread)
            if isinstance(e, TimeoutError):
                self.counters["call_timeouts"] += 1
                name = getattr(fn, "__qualname__", getattr(fn, "__name__", "call"))
                raise CallTimedOut(f"{task.name}: {name} took longer than {self.call_timeout_s:g}s") from None
            raise

    def _close_later(self, live: _Live) -> Callable[[Future[Any]], None]:
        """`late` for a call on a session that was ended meanwhile: close it once its call returned."""
        def close(_: Future[Any]) -> None:
            self._close_off_loop(live.session)
        return close

    def _close_started(self, f: Future[Any]) -> None:
        """`late` for a start that timed out: the session it made after all is nobody's; close it."""
        if not f.cancelled() and f.exception() is None:
            self._close_off_loop(f.result())

    def _close_off_loop(self, session: Session) -> None:
        with contextlib.suppress(RuntimeError):  # the pool was shut down: the process is exiting
            self.pool.submit(session.close)

    def _end_here(self, sid: str, reason: str) -> None:
        self.sessions.pop(sid, None)
        self.ended[sid] = reason
        while len(self.ended) > MAX_ENDED:
            self.ended.popitem(last=False)

    async def _body(self, request: web.Request) -> Any:
        return await read_json(request, self.max_body_bytes, self.body_timeout_s)

    def _live(self, body: Any) -> tuple[str, _Live]:
        sid = require(body, "session_id")
        live = self.sessions.get(sid)
        if live is None:
            raise EnvError("unknown_session", f"no session {shown(sid)} on worker {self.worker_id}")
        live.last_used = time.monotonic()
        return sid, live

    def _busy(self, sid: str, live: _Live) -> None:
        if live.lock.locked():
            self.counters["busy"] += 1
            raise EnvError("busy", f"session {sid} is already running a call; send one call at a time")

    def _task(self, name: str) -> Task:
        if name not in self.tasks:
            raise EnvError("unknown_task", f"worker {self.worker_id} does not serve task {shown(name)}")
        return self.tasks[name]

    @property
    def taken(self) -> int:
        return len(self.sessions) + self.starting + self.stuck

    def unhealthy(self) -> dict[str, str]:
        """Tasks whose last `UNHEALTHY_AFTER` starts all failed here -> the last error (heartbeats carry it)."""
        return {name: self.last_start_error.get(name, "") for name, n in self.start_failures.items()
                if n >= UNHEALTHY_AFTER}

    def _start_failed(self, task: str, e: BaseException) -> None:
        if isinstance(e, EnvError) and e.code in NOT_A_FAULT:
            return
        self.counters["failed_starts"] += 1
        self.start_failures[task] = self.start_failures.get(task, 0) + 1
        self.last_start_error[task] = f"{type(e).__name__}: {e}"[:300]
        if self.start_failures[task] == UNHEALTHY_AFTER:
            log.error("task %s: the last %d starts failed (%s): reporting it unhealthy", task, UNHEALTHY_AFTER,
                      self.last_start_error[task])
            self.changed.set()

    def load(self) -> dict[str, Any]:
        per_task: dict[str, int] = {name: 0 for name in self.tasks}
        for live in self.sessions.values():
            per_task[live.task] += 1
        return {"worker_id": self.worker_id, "tasks": list(self.tasks), "slots": self.slots,
                "active": len(self.sessions), "free": max(0, self.slots - self.taken), "stuck": self.stuck,
                "draining": self.draining, "sessions": per_task, "unhealthy": self.unhealthy(), **self.counters,
                "connections": self.guard.stats() if self.guard is not None else {}}

    def idle_candidates(self, limit: int = 1000) -> list[str]:
        """Sessions quiet here past the idle limit (at most `limit`): the controller says which to drop.

        Each is marked used now, so a session the controller keeps (its client is waiting on a slow
        generation) is asked about again only after another idle period.
        """
        now = time.monotonic()
        cutoff = now - self.session_idle_s
        stale = [sid for sid, live in self.sessions.items() if live.last_used < cutoff][:limit]
        for sid in stale:
            self.sessions[sid].last_used = now
        return stale

    def drop(self, session_ids: list[str]) -> None:
        """Forget sessions the controller no longer holds; their resources are freed off the event loop."""
        for sid in session_ids:
            live = self.sessions.pop(sid, None)
            if live is not None:
                task = asyncio.get_running_loop().create_task(self._close(live))
                self._closing.add(task)  # the loop holds tasks only weakly
                task.add_done_callback(self._closing.discard)

    async def _close(self, live: _Live) -> None:
        async with live.lock:  # after a step in flight has finished
            try:
                await self._run(live.session.task, live.session.close)
            except CallTimedOut as e:
                log.warning("closing a session: %s", e)

    def start_draining(self) -> None:
        self.draining = True
        self.changed.set()

    def shutdown(self) -> None:
        """Stop taking task work; threads still running finish in the background (never joined)."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.host is not None:
            self.host.close()

    def _live_of(self, task: str) -> int:
        """Sessions of `task` this worker holds or is starting."""
        return self.starting_by_task.get(task, 0) + sum(1 for live in self.sessions.values() if live.task == task)

    # ------------------------------------------------------------------------------------ routes
    async def start_sample(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        task = self._task(require(body, "task"))
        index = require(body, "index")
        if self.draining:
            raise EnvError("no_capacity", f"worker {self.worker_id} is draining")
        if self.taken >= self.slots:
            raise EnvError("no_capacity", f"worker {self.worker_id} is full ({self.slots} slots)")
        cap = self.task_caps.get(task.name)
        if cap is not None and self._live_of(task.name) >= cap:
            raise EnvError("no_capacity", f"worker {self.worker_id} holds {cap} {task.name} sessions, all this "
                                          f"host's tables allow at once")
        self.starting += 1
        self.starting_by_task[task.name] = self.starting_by_task.get(task.name, 0) + 1
        try:
            if self.host is not None and task.name in self.isolated:
                session: Session | ProcessSession = await self._run(
                    task, ProcessSession, self.host, task, index, self.kill_after_s, self.kill_after_s,
                    self.message_budget_s, late=self._close_started)
            else:
                session = await self._run(task, Session, task, index, self.toolboxes[task.name],
                                          self.max_output_chars, self.message_budget_s, late=self._close_started)
        except CallTimedOut as e:
            self._start_failed(task.name, e)
            raise EnvError("env_error", str(e)) from None
        except Exception as e:
            self._start_failed(task.name, e)
            raise
        finally:
            self.starting -= 1
            self.starting_by_task[task.name] -= 1
        if self.start_failures.pop(task.name, 0) >= UNHEALTHY_AFTER:
            self.changed.set()  # healthy again: say so now
        sid = uuid.uuid4().hex
        self.sessions[sid] = _Live(session=session, task=task.name, last_used=time.monotonic())
        start = StartResult(sid, session.messages, session.tools, task.max_turns)
        return web.json_response(start.to_wire())

    async def interact(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        sid = require(body, "session_id")
        if sid in self.ended:  # this worker ended it (a call timed out): say so on every later call
            return web.json_response(InteractResult.ended(Status.ENV_ERROR, self.ended[sid]).to_wire())
        sid, live = self._live(body)
        message = clean_message(require(body, "message", dict))  # no unpaired surrogate reaches a task
        self._busy(sid, live)
        async with live.lock:
            try:
                result: InteractResult = await self._run(live.session.task, live.session.interact, message,
                                                         late=self._close_later(live))
            except CallTimedOut as e:
                reason = f"{e}; the session was ended"
                self._end_here(sid, reason)
                return web.json_response(InteractResult.ended(Status.ENV_ERROR, reason).to_wire())
        if result.done:
            self.sessions.pop(sid, None)  # the slot frees as soon as the episode ends
        return web.json_response(result.to_wire())

    async def cancel(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        sid = require(body, "session_id")
        self.ended.pop(sid, None)
        live = self.sessions.pop(sid, None)  # idempotent: cancelling twice is fine
        if live is not None:  # free its sandbox or database, after a step in flight has finished
            await self._close(live)
        return web.json_response({"ok": True})

    async def expert(self, request: web.Request) -> web.Response:
        if not self.expert_route:
            raise EnvError("forbidden", "the expert route is off in this run (envs.expert_route)")
        sid, live = self._live(await self._body(request))
        self._busy(sid, live)
        async with live.lock:
            try:
                message = await self._run(live.session.task, live.session.expert_message,
                                          late=self._close_later(live))
            except CallTimedOut as e:
                reason = f"{e}; the session was ended"
                self._end_here(sid, reason)
                raise EnvError("env_error", reason) from None
        return web.json_response({"message": message})

    async def indices(self, request: web.Request) -> web.Response:
        task = self._task(request.query.get("task", ""))
        split = request.query.get("split", "")
        try:
            indices = await self._run(task, task.indices, split)
        except EnvError:
            raise
        except Exception as e:
            raise EnvError("env_error", f"{task.name}.indices({shown(split)}) failed: "
                                        f"{type(e).__name__}: {str(e)[:200]}") from e
        return web.json_response({"indices": list(indices)})

    async def status(self, request: web.Request) -> web.Response:
        return web.json_response(self.load())

    async def drain(self, request: web.Request) -> web.Response:
        """Take no new sessions; the ones held run to their end. There is no undrain: restart instead."""
        self.start_draining()
        return web.json_response({"ok": True, "active": len(self.sessions)})


def _error_middleware(worker: EnvWorker) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every failure of one request becomes a JSON error for that request only."""
        try:
            return await handler(request)
        except ConnectionResetError:  # the caller hung up mid-request: nobody to answer
            return web.Response(status=499)
        except Exception as e:
            response = error_response(e, request, unhandled_code="env_error")
            if not isinstance(e, EnvError | web.HTTPException):
                worker.counters["unhandled"] += 1
            return response
    return middleware


def create_worker_app(worker: EnvWorker, secret: str | None = None,
                      limits: ConnectionLimits | None = None) -> web.Application:
    """The worker as an aiohttp app; `secret`: required on every route (None: no check, loopback tests);
    `limits`: what a connection may hold before it shows the secret (`agentrl.serving.listener`)."""
    def rejected() -> None:
        worker.counters["unauthorized"] += 1

    guard = worker.guard = ConnectionGuard(limits or ConnectionLimits(), secret, rejected)
    app = web.Application(middlewares=[auth_middleware(secret, rejected, guard.trust), _error_middleware(worker)],
                          client_max_size=worker.max_body_bytes)
    app[GUARD_KEY] = guard
    app.add_routes([
        web.post("/start_sample", worker.start_sample), web.post("/interact", worker.interact),
        web.post("/cancel", worker.cancel), web.post("/expert", worker.expert),
        web.get("/indices", worker.indices), web.get("/status", worker.status), web.post("/drain", worker.drain),
    ])
    return app


# ---------------------------------------------------------------------------------------- serving

class RunningWorker:
    """A worker being served on a socket and kept registered with the controller."""

    def __init__(self, worker: EnvWorker, runner: web.AppRunner, address: str, controller_url: str,
                 heartbeat_s: float, secret: str | None = None) -> None:
        self.worker = worker
        self.runner = runner
        self.address = address
        self.controller_url = controller_url.rstrip("/")
        self.heartbeat_s = heartbeat_s
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=max(2.0, 2 * heartbeat_s)),
                                          headers=auth_header(secret))
        self._loop_task: asyncio.Task[None] | None = None

    async def _post(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        async with self.http.post(f"{self.controller_url}{route}", json=body) as resp:
            data = await resp.json()
            if resp.status != 200 or not isinstance(data, dict):
                raise EnvError.from_wire(data, resp.status)
            return data

    async def register(self) -> None:
        w = self.worker
        sessions = [{"session_id": sid, "task": live.task} for sid, live in w.sessions.items()]
        answer = await self._post("/register", {"worker_id": w.worker_id, "address": self.address,
                                                "tasks": list(w.tasks), "slots": w.slots, "sessions": sessions})
        w.drop([str(sid) for sid in answer.get("drop") or []])  # ended there meanwhile (e.g. we were declared dead)
        log.info("registered %s at %s with %s", w.worker_id, self.controller_url, self.address)

    async def heartbeat_once(self) -> None:
        w = self.worker
        idle = w.idle_candidates()
        answer = await self._post("/heartbeat", {"worker_id": w.worker_id, "active": len(w.sessions),
                                                 "draining": w.draining, "idle": idle, "unhealthy": w.unhealthy()})
        if answer.get("reregister"):
            await self.register()
        else:
            w.drop(list(answer.get("drop") or []))

    async def _heartbeat_loop(self) -> None:
        registered = False
        woken: asyncio.Task[bool] | None = None
        try:
            while True:
                self.worker.changed.clear()
                try:
                    if not registered:
                        await self.register()
                        registered = True
                    else:
                        await self.heartbeat_once()
                except (TimeoutError, aiohttp.ClientError, EnvError, ValueError) as e:
                    # the controller may be starting or restarting: keep trying, never give up serving
                    log.warning("controller %s unreachable: %s", self.controller_url, e)
                except Exception:  # a bug here must not silently stop the heartbeats
                    log.exception("heartbeat failed")
                # the next beat is due in heartbeat_s, or at once when a drain starts (asyncio.wait,
                # not wait_for: on 3.11 wait_for can swallow the cancellation that stops this loop)
                if woken is None or woken.done():
                    woken = asyncio.ensure_future(self.worker.changed.wait())
                await asyncio.wait([woken], timeout=self.heartbeat_s)
        finally:
            if woken is not None:
                woken.cancel()

    async def drain(self, timeout_s: float, poll_s: float = 0.1) -> int:
        """Take no new sessions, tell the controller at once, wait up to `timeout_s` for the held ones
        to end. Returns how many are still held."""
        self.worker.start_draining()
        deadline = time.monotonic() + timeout_s
        while self.worker.sessions and time.monotonic() < deadline:
            await asyncio.sleep(poll_s)
        return len(self.worker.sessions)

    def start_heartbeats(self) -> None:
        """Register (again) and heartbeat in the background."""
        self._loop_task = asyncio.create_task(self._heartbeat_loop())

    async def stop_heartbeats(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
            self._loop_task = None

    async def stop(self) -> None:
        """Stop heartbeats, tell the controller we drain (best effort), close the socket. Idempotent."""
        if self.http.closed:
            return
        await self.stop_heartbeats()
        self.worker.draining = True
        try:
            await self.heartbeat_once()
        except (aiohttp.ClientError, TimeoutError, EnvError, ValueError) as e:  # the controller may be gone
            log.debug("final heartbeat failed: %s", e)
        await self.http.close()
        await self.runner.cleanup()
        self.worker.shutdown()


async def start_worker(envs: EnvsConfig, controller: ControllerConfig, controller_url: str, worker_id: str,
                       host: str = "127.0.0.1", advertise_host: str | None = None, port: int = 0,
                       tasks: Mapping[str, Task] | None = None, secret: str | None = None,
                       expert_route: bool | None = None) -> RunningWorker:
    """Serve `envs.tasks` on host:port (0 = a free port), register, and heartbeat in the background.

    Args:
        envs: task names, slot count and the per-message limits.
        controller: heartbeat period, session idle limit, request timeout and body limits (the
            controller's timing, shared).
        controller_url: e.g. "http://node1:8000".
        worker_id: unique among the workers of the run.
        host: interface to bind; advertise_host: the host name the controller should call (default host).
        tasks: already-built tasks by name (tests); default: `get_task` for each of `envs.tasks`.
        secret: the run's secret (`agentrl.auth.run_secret`), required of every caller and sent to the
            controller; None only for in-process tests on loopback (refused on any other interface).
        expert_route: answer /expert; None: `envs.expert_route == "enabled"` (the jobs resolve "auto"
            with `agentrl.serving.process.expert_route_on`).
    """
    check_exposure(host, secret)
    if tasks is None:
        from agentrl.tasks import get_task  # deferred: only a serving worker needs the registry

        built = [get_task(name, **envs.task_options.get(name, {})) for name in envs.tasks]
        tasks = {t.name: t for t in built}
    for task in tasks.values():  # a sandboxing task the host holds fewer sessions of: capped, said once here
        cap = task_cap(task, envs.slots)
        if cap < 1:
            raise ValueError(f"{task.name}: this host holds no session of it ({task.session_cap_why()})")
        if cap < envs.slots:
            log.warning("%s: at most %d sessions at once on this host of this worker's %d slots (%s); its starts "
                        "past that wait for a free one, the other tasks keep the rest", task.name, cap, envs.slots,
                        task.session_cap_why())
    worker = EnvWorker(tasks, envs, controller, worker_id,
                       expert_route=envs.expert_route == "enabled" if expert_route is None else expert_route)
    app = create_worker_app(worker, secret, ConnectionLimits.of(controller))
    runner = web.AppRunner(app, **runner_args(controller))
    await runner.setup()
    site = GuardedSite(runner, host, port, app[GUARD_KEY])
    await site.start()
    address = f"http://{advertise_host or host}:{site.port}"
    running = RunningWorker(worker, runner, address, controller_url, controller.heartbeat_s, secret)
    running.start_heartbeats()
    return running
