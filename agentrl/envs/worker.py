"""The env worker: an aiohttp server that hosts the sessions of one or more tasks.

It serves the gateway routes (start_sample, interact, cancel, expert, indices, status) for the
controller to forward to, plus POST /drain. It holds at most `slots` sessions and refuses new ones
with 503 no_capacity when full or draining; a draining worker still serves the sessions it holds until
they end. Task code runs behind `Session`, so a raising task ends its episode as env_error instead of
crashing the worker. `start_worker` also registers with the controller and heartbeats every
`heartbeat_s`; it re-registers (listing its live sessions) whenever the controller says it does not
know it.

Expiry belongs to the controller (it hears the client's keep-alives; the worker does not). A session
quiet on the worker for longer than the controller's idle limit is only a candidate: the next heartbeat
lists it, and the worker drops it only if the controller answers that it no longer holds it.

Not here: routing, dead-worker detection (the controller's), process setup and logging config
(`jobs/env_worker.py`), sandboxes (tasks that run untrusted code own theirs).
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from agentrl.config import ControllerConfig, EnvsConfig
from agentrl.envs.api import (
    MAX_ARGUMENT_BYTES,
    MAX_OUTPUT_CHARS,
    EnvError,
    InteractResult,
    Session,
    StartResult,
    Task,
    ToolBox,
    require,
)
from agentrl.envs.wire import error_response

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class _Live:
    session: Session
    task: str
    last_used: float
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class EnvWorker:
    """Sessions of the hosted tasks and the route handlers over them."""

    def __init__(self, tasks: Mapping[str, Task], slots: int, worker_id: str, session_idle_s: float = 600.0,
                 max_argument_bytes: int = MAX_ARGUMENT_BYTES, max_output_chars: int = MAX_OUTPUT_CHARS) -> None:
        self.tasks = dict(tasks)
        self.toolboxes = {name: ToolBox(t.tools(), max_argument_bytes) for name, t in self.tasks.items()}
        self.slots = slots
        self.worker_id = worker_id
        self.session_idle_s = session_idle_s
        self.max_output_chars = max_output_chars
        self.draining = False
        self.sessions: dict[str, _Live] = {}
        self.changed = asyncio.Event()
        """Set when the controller should hear from us before the next heartbeat is due (a drain)."""

    # ------------------------------------------------------------------------------------ helpers
    async def _run(self, task: Task, fn: Callable[..., Any], *args: Any) -> Any:
        # Task code is called directly (fast tasks like lookup); a task that says it blocks gets a thread.
        if getattr(task, "blocking", False):
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    def _live(self, body: Any) -> tuple[str, _Live]:
        sid = require(body, "session_id")
        live = self.sessions.get(sid)
        if live is None:
            raise EnvError("unknown_session", f"no session {sid!r} on worker {self.worker_id}")
        live.last_used = time.monotonic()
        return sid, live

    def _task(self, name: str) -> Task:
        if name not in self.tasks:
            raise EnvError("unknown_task", f"worker {self.worker_id} does not serve task {name!r}")
        return self.tasks[name]

    def load(self) -> dict[str, Any]:
        per_task: dict[str, int] = {name: 0 for name in self.tasks}
        for live in self.sessions.values():
            per_task[live.task] += 1
        return {"worker_id": self.worker_id, "tasks": list(self.tasks), "slots": self.slots,
                "active": len(self.sessions), "free": self.slots - len(self.sessions), "draining": self.draining,
                "sessions": per_task}

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
        for sid in session_ids:
            live = self.sessions.pop(sid, None)
            if live is not None:
                live.session.close()

    def start_draining(self) -> None:
        self.draining = True
        self.changed.set()

    # ------------------------------------------------------------------------------------ routes
    async def start_sample(self, request: web.Request) -> web.Response:
        body = await request.json()
        task = self._task(require(body, "task"))
        index = require(body, "index")
        if self.draining:
            raise EnvError("no_capacity", f"worker {self.worker_id} is draining")
        if len(self.sessions) >= self.slots:
            raise EnvError("no_capacity", f"worker {self.worker_id} is full ({self.slots} slots)")
        session = await self._run(task, Session, task, index, self.toolboxes[task.name], self.max_output_chars)
        sid = uuid.uuid4().hex
        self.sessions[sid] = _Live(session=session, task=task.name, last_used=time.monotonic())
        start = StartResult(sid, session.messages, session.toolbox.tools, task.max_turns)
        return web.json_response(start.to_wire())

    async def interact(self, request: web.Request) -> web.Response:
        body = await request.json()
        sid, live = self._live(body)
        message = require(body, "message", dict)
        async with live.lock:  # one step at a time per session, even when a task runs in a thread
            result: InteractResult = await self._run(live.session.task, live.session.interact, message)
        if result.done:
            self.sessions.pop(sid, None)  # the slot frees as soon as the episode ends
        return web.json_response(result.to_wire())

    async def cancel(self, request: web.Request) -> web.Response:
        body = await request.json()
        live = self.sessions.pop(require(body, "session_id"), None)  # idempotent: cancelling twice is fine
        if live is not None:  # free its sandbox or database, after a step in flight has finished
            async with live.lock:
                await self._run(live.session.task, live.session.close)
        return web.json_response({"ok": True})

    async def expert(self, request: web.Request) -> web.Response:
        _, live = self._live(await request.json())
        async with live.lock:
            message = await self._run(live.session.task, live.session.expert_message)
        return web.json_response({"message": message})

    async def indices(self, request: web.Request) -> web.Response:
        task = self._task(request.query.get("task", ""))
        split = request.query.get("split", "")
        try:
            indices = await self._run(task, task.indices, split)
        except EnvError:
            raise
        except Exception as e:
            raise EnvError("env_error", f"{task.name}.indices({split!r}) failed: {type(e).__name__}: {e}") from e
        return web.json_response({"indices": list(indices)})

    async def status(self, request: web.Request) -> web.Response:
        return web.json_response(self.load())

    async def drain(self, request: web.Request) -> web.Response:
        """Take no new sessions; the ones held run to their end. There is no undrain: restart instead."""
        self.start_draining()
        return web.json_response({"ok": True, "active": len(self.sessions)})


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure of one request becomes a JSON error for that request only."""
    try:
        return await handler(request)
    except Exception as e:
        return error_response(e, request, unhandled_code="env_error")


def create_worker_app(worker: EnvWorker, max_body_bytes: int = 4 * 1024 * 1024) -> web.Application:
    app = web.Application(middlewares=[error_middleware], client_max_size=max_body_bytes)
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
                 heartbeat_s: float) -> None:
        self.worker = worker
        self.runner = runner
        self.address = address
        self.controller_url = controller_url.rstrip("/")
        self.heartbeat_s = heartbeat_s
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=max(2.0, 2 * heartbeat_s)))
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
        for sid in answer.get("drop", []):  # sessions the controller already ended (e.g. declared us dead)
            w.sessions.pop(sid, None)
        log.info("registered %s at %s with %s", w.worker_id, self.controller_url, self.address)

    async def heartbeat_once(self) -> None:
        w = self.worker
        idle = w.idle_candidates()
        answer = await self._post("/heartbeat", {"worker_id": w.worker_id, "active": len(w.sessions),
                                                 "draining": w.draining, "idle": idle})
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


async def start_worker(envs: EnvsConfig, controller: ControllerConfig, controller_url: str, worker_id: str,
                       host: str = "127.0.0.1", advertise_host: str | None = None, port: int = 0,
                       tasks: Mapping[str, Task] | None = None) -> RunningWorker:
    """Serve `envs.tasks` on host:port (0 = a free port), register, and heartbeat in the background.

    Args:
        envs: task names and slot count.
        controller: heartbeat period and session idle limit (the controller's timing, shared).
        controller_url: e.g. "http://node1:8000".
        worker_id: unique among the workers of the run.
        host: interface to bind; advertise_host: the host name the controller should call (default host).
        tasks: already-built tasks by name (tests); default: `get_task` for each of `envs.tasks`.
    """
    if tasks is None:
        from agentrl.envs.tasks import get_task  # deferred: only a serving worker needs the registry

        built = [get_task(name, **envs.task_options.get(name, {})) for name in envs.tasks]
        tasks = {t.name: t for t in built}
    # The controller expires idle sessions and cancels them here; the worker asks about its own quiet
    # ones (later by a margin, so the two rarely cross) only to free slots the controller forgot.
    worker = EnvWorker(tasks, envs.slots, worker_id,
                       session_idle_s=controller.session_idle_s + controller.dead_after_s,
                       max_argument_bytes=envs.max_argument_bytes, max_output_chars=envs.max_output_chars)
    runner = web.AppRunner(create_worker_app(worker, controller.max_body_bytes), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound_port = runner.addresses[0][1]
    address = f"http://{advertise_host or host}:{bound_port}"
    running = RunningWorker(worker, runner, address, controller_url, controller.heartbeat_s)
    running.start_heartbeats()
    return running
