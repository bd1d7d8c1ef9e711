"""The env controller: the gateway the rollout talks to, in front of the env workers.

One asyncio process. It routes each new session to the live, non-draining worker of its task with
the most free slots, forwards interact/cancel/expert to the worker that owns the session, answers
/indices from any live worker of the task (cached: indices are deterministic), expires idle sessions,
and declares a worker dead after `dead_after_s` without a heartbeat (or at once when its socket
refuses a call). Sessions of a dead worker end as env_error: their next interact answers done=true,
status "env_error". An interact whose worker call fails or times out also ends the session as
env_error (the episode state on the worker is unknown), so interact answers 502 only for a session's
own bad request relayed from the worker, never for infrastructure.

Not here: the state and routing rule (`registry.py`), process setup, signals and logging
(`jobs/controller.py`).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Middleware

from agentrl.config import ControllerConfig
from agentrl.controller.registry import Ended, LatencyStats, Registry, WorkerEntry
from agentrl.envs.api import EnvError, InteractResult, require
from agentrl.envs.wire import error_response
from agentrl.types import Status

log = logging.getLogger(__name__)

GATEWAY_ROUTES = frozenset({"/start_sample", "/interact", "/cancel", "/expert", "/indices"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class WorkerUnreachable(Exception):
    """The worker's socket refused or dropped the call: the process is most likely gone."""


class Controller:
    def __init__(self, cfg: ControllerConfig) -> None:
        self.cfg = cfg
        self.registry = Registry()
        self.latency = LatencyStats()
        self.errors = 0
        self.indices_cache: dict[tuple[str, str], list[str]] = {}
        self.http: aiohttp.ClientSession | None = None
        self._background: set[asyncio.Task[Any]] = set()

    # ---------------------------------------------------------------------------------- lifecycle
    async def on_startup(self, app: web.Application) -> None:
        # 4096 sockets to workers cover 10,000 sessions: a call holds one only while a step runs
        self.http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=4096, limit_per_host=4096),
            timeout=aiohttp.ClientTimeout(total=self.cfg.request_timeout_s))
        self._spawn(self._janitor())

    async def on_cleanup(self, app: web.Application) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self.http is not None:
            await self.http.close()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)  # keep a reference: the loop holds tasks only weakly
        task.add_done_callback(self._background.discard)

    async def _janitor(self) -> None:
        cfg = self.cfg
        period = min(cfg.heartbeat_s, cfg.dead_after_s / 2, cfg.session_idle_s / 2)
        while True:
            await asyncio.sleep(period)
            try:
                self._sweep()
            except Exception:  # a bug here must not stop expiry for the rest of the run
                log.exception("controller sweep failed")

    def _sweep(self) -> None:
        cfg = self.cfg
        dead, idle = self.registry.expire(time.monotonic(), cfg.dead_after_s, cfg.session_idle_s,
                                          tombstone_ttl_s=max(cfg.session_idle_s, 600.0))
        for wid in dead:
            log.warning("worker %s missed heartbeats for %.1fs: declared dead", wid, cfg.dead_after_s)
        self.errors += len(idle)
        for s in idle:
            worker = self.registry.workers.get(s.worker_id)
            if worker is not None and worker.alive:
                self._spawn(self._quiet_cancel(worker, s.session_id))

    async def _quiet_cancel(self, worker: WorkerEntry, sid: str) -> None:
        try:
            await self._forward(worker, "POST", "/cancel", {"session_id": sid})
        except (WorkerUnreachable, EnvError) as e:
            log.debug("cancel of %s on %s failed: %s", sid, worker.worker_id, e)

    # ---------------------------------------------------------------------------------- forwarding
    async def _forward(self, worker: WorkerEntry, method: str, route: str, body: dict[str, Any] | None = None,
                       params: dict[str, str] | None = None) -> tuple[int, Any]:
        """One call to a worker → (HTTP status, JSON body). Raises WorkerUnreachable or EnvError(env_error)."""
        assert self.http is not None
        try:
            async with self.http.request(method, worker.address + route, json=body, params=params) as resp:
                return resp.status, await resp.json(content_type=None)
        except (aiohttp.ClientConnectionError, ConnectionError) as e:
            if isinstance(e, aiohttp.ServerTimeoutError):
                raise EnvError("env_error", f"worker {worker.worker_id} timed out on {route}") from e
            raise WorkerUnreachable(f"worker {worker.worker_id} unreachable on {route}: {e}") from e
        except TimeoutError as e:
            raise EnvError("env_error", f"worker {worker.worker_id} timed out on {route} "
                                        f"({self.cfg.request_timeout_s:g}s)") from e
        except ValueError as e:
            raise EnvError("env_error", f"worker {worker.worker_id} sent a non-JSON answer on {route}") from e
        except aiohttp.ClientError as e:
            raise EnvError("env_error", f"worker {worker.worker_id} failed on {route}: {e}") from e

    def _worker_down(self, worker: WorkerEntry, err: WorkerUnreachable) -> None:
        log.warning("%s: declared dead", err)
        self.errors += len(self.registry.mark_dead(worker.worker_id, str(err), time.monotonic()))

    def _session(self, sid: str) -> tuple[WorkerEntry | None, Ended | None]:
        """(owning worker, None) for a live session, (None, why) for one that ended; else 404."""
        entry = self.registry.sessions.get(sid)
        if entry is not None:
            entry.last_used = time.monotonic()
            return self.registry.workers[entry.worker_id], None
        ended = self.registry.tombstones.get(sid)
        if ended is not None:
            return None, ended
        raise EnvError("unknown_session", f"no session {sid!r}")

    # ---------------------------------------------------------------------------------- gateway
    async def start_sample(self, request: web.Request) -> web.Response:
        body = await request.json()
        task, index = require(body, "task"), require(body, "index")
        tried: set[str] = set()
        last: EnvError | None = None
        while True:
            try:
                worker = self.registry.pick(task, exclude=tried)
            except EnvError as e:
                raise (last if last is not None and e.code == "no_capacity" else e) from None
            tried.add(worker.worker_id)
            worker.pending += 1
            try:
                status, data = await self._forward(worker, "POST", "/start_sample", {"task": task, "index": index})
            except WorkerUnreachable as e:
                self._worker_down(worker, e)
                continue
            except EnvError as e:  # a timeout: another worker may answer
                last = e
                continue
            finally:
                worker.pending -= 1
            if status == 200 and worker.alive:
                self.registry.add_session(data["session_id"], task, worker.worker_id, time.monotonic())
                return web.json_response(data)
            err = EnvError.from_wire(data, status) if status != 200 else EnvError("env_error", "worker died")
            if err.code != "no_capacity":  # the sample's own problem (bad index, task failure): no retry
                raise err
            last = err  # the worker is fuller than we counted (or draining): try the next one

    async def interact(self, request: web.Request) -> web.Response:
        body = await request.json()
        sid = require(body, "session_id")
        message = require(body, "message", dict)
        worker, ended = self._session(sid)
        if worker is None:
            assert ended is not None
            return web.json_response(InteractResult.ended(ended.status, ended.reason).to_wire())
        try:
            status, data = await self._forward(worker, "POST", "/interact", {"session_id": sid, "message": message})
        except (WorkerUnreachable, EnvError) as e:
            if isinstance(e, WorkerUnreachable):
                self._worker_down(worker, e)
            else:
                self._spawn(self._quiet_cancel(worker, sid))
            return self._end_with_error(sid, str(e))
        if status == 200:
            if data.get("done"):
                self.registry.end_session(sid)
                if data.get("status") == Status.ENV_ERROR.value:
                    self.errors += 1
            return web.json_response(data)
        err = EnvError.from_wire(data, status)
        if err.code == "unknown_session":  # the worker lost it (restart, its own expiry): infrastructure
            return self._end_with_error(sid, f"worker {worker.worker_id} lost the session")
        raise err

    def _end_with_error(self, sid: str, reason: str) -> web.Response:
        self.errors += 1
        ended = Ended(Status.ENV_ERROR, reason, time.monotonic())
        if sid in self.registry.sessions:
            self.registry.end_session(sid, ended)
        return web.json_response(InteractResult.ended(ended.status, reason).to_wire())

    async def cancel(self, request: web.Request) -> web.Response:
        sid = require(await request.json(), "session_id")
        worker, _ = self._session(sid)
        if worker is not None:
            self.registry.end_session(sid)
            try:
                await self._forward(worker, "POST", "/cancel", {"session_id": sid})
            except WorkerUnreachable as e:
                self._worker_down(worker, e)
            except EnvError as e:  # the session is gone here; the worker's idle sweep frees its slot
                log.debug("cancel of %s: %s", sid, e)
        return web.json_response({"ok": True})

    async def expert(self, request: web.Request) -> web.Response:
        sid = require(await request.json(), "session_id")
        worker, ended = self._session(sid)
        if worker is None:
            assert ended is not None
            raise EnvError("env_error", f"session ended: {ended.reason}")
        try:
            status, data = await self._forward(worker, "POST", "/expert", {"session_id": sid})
        except WorkerUnreachable as e:
            self._worker_down(worker, e)
            raise EnvError("env_error", str(e)) from e
        if status != 200:
            raise EnvError.from_wire(data, status)
        return web.json_response(data)

    async def indices(self, request: web.Request) -> web.Response:
        task, split = request.query.get("task", ""), request.query.get("split", "")
        key = (task, split)
        if key not in self.indices_cache:
            worker = self.registry.any_worker(task)
            try:
                status, data = await self._forward(worker, "GET", "/indices", params={"task": task, "split": split})
            except WorkerUnreachable as e:
                self._worker_down(worker, e)
                raise EnvError("env_error", str(e)) from e
            if status != 200:
                raise EnvError.from_wire(data, status)
            self.indices_cache[key] = list(data["indices"])
        return web.json_response({"indices": self.indices_cache[key]})

    async def status(self, request: web.Request) -> web.Response:
        reg = self.registry
        return web.json_response({
            "workers": [w.to_wire() for w in sorted(reg.workers.values(), key=lambda w: w.worker_id)],
            "sessions": reg.sessions_per_task(), "active_sessions": len(reg.sessions),
            "latency_ms": self.latency.summary(), "errors": self.errors, "ended_sessions": len(reg.tombstones)})

    # ---------------------------------------------------------------------------------- workers
    async def register(self, request: web.Request) -> web.Response:
        body = await request.json()
        worker_id, address = require(body, "worker_id"), require(body, "address")
        tasks, slots = require(body, "tasks", list), require(body, "slots", int)
        sessions = [(require(s, "session_id"), require(s, "task")) for s in body.get("sessions") or []]
        drop = self.registry.register(worker_id, address, [str(t) for t in tasks], slots, sessions, time.monotonic())
        log.info("worker %s registered at %s: tasks %s, %d slots", worker_id, address, tasks, slots)
        return web.json_response({"ok": True, "drop": drop})

    async def heartbeat(self, request: web.Request) -> web.Response:
        body = await request.json()
        known = self.registry.heartbeat(require(body, "worker_id"), int(body.get("active", 0)),
                                        bool(body.get("draining", False)), time.monotonic())
        return web.json_response({"ok": known, "reregister": not known})


CONTROLLER_KEY = web.AppKey("controller", Controller)


def _make_middleware(controller: Controller) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Time gateway calls; turn any failure into a JSON error for this request only."""
        t0 = time.perf_counter()
        try:
            return await handler(request)
        except Exception as e:
            response = error_response(e, request, unhandled_code="internal")
            if response.status >= 500:
                controller.errors += 1
            return response
        finally:
            if request.path in GATEWAY_ROUTES:
                controller.latency.record((time.perf_counter() - t0) * 1000.0)
    return middleware


def create_controller_app(cfg: ControllerConfig) -> web.Application:
    """The controller as an aiohttp app (serve it with web.AppRunner; `start_controller` does)."""
    controller = Controller(cfg)
    app = web.Application(middlewares=[_make_middleware(controller)])
    app[CONTROLLER_KEY] = controller
    app.on_startup.append(controller.on_startup)
    app.on_cleanup.append(controller.on_cleanup)
    app.add_routes([
        web.post("/start_sample", controller.start_sample), web.post("/interact", controller.interact),
        web.post("/cancel", controller.cancel), web.post("/expert", controller.expert),
        web.get("/indices", controller.indices), web.get("/status", controller.status),
        web.post("/register", controller.register), web.post("/heartbeat", controller.heartbeat),
    ])
    return app


class RunningController:
    """A controller app served on a socket: `url` to publish, `stop()` to close it."""

    def __init__(self, runner: web.AppRunner, url: str) -> None:
        self.runner = runner
        self.url = url

    @property
    def controller(self) -> Controller:
        return self.runner.app[CONTROLLER_KEY]

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start_controller(cfg: ControllerConfig, advertise_host: str | None = None) -> RunningController:
    """Serve the controller on cfg.host:cfg.port (port 0: a free one); the URL uses `advertise_host`."""
    runner = web.AppRunner(create_controller_app(cfg), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port)
    await site.start()
    port = runner.addresses[0][1]
    return RunningController(runner, f"http://{advertise_host or cfg.host}:{port}")
