"""The env controller: the server the rollout talks to, in front of the env workers.

One asyncio process. It routes each new session to the live, non-draining worker of its task with
the most free slots (a suspect worker, whose last call failed, only when no other has room),
forwards interact/cancel/expert to the worker that owns the session, answers /indices from any live
worker of the task (cached: indices are deterministic), expires idle sessions, and declares a worker
dead after `dead_after_s` without a heartbeat, at once when its socket refuses a call, or after
`max_worker_failures` calls in a row that timed out or got a garbage answer.

Every infrastructure failure costs only the sessions it touches: a session whose worker died, hung
or answered garbage ends as env_error (its next interact answers done=true, status "env_error"), and
interact answers an HTTP error only for the caller's own mistake (unknown session, bad request).

Idle means "nothing heard from the client": no call and no keep-alive (POST /touch, which the env
client sends for every session it holds). A session waiting for a slow generation or a weight sync
therefore lives as long as its rollout process keeps its event loop running.

Operator routes: GET /status (workers, sessions per task, latency percentiles, the controller's own
overhead per call, failures by class) and POST /drain {"worker_id"} (no new sessions there; its own
run to their end).

Every route, the workers' /register and /heartbeat included, requires the run's secret
(`agentrl.auth`, checked before the body is read: a forged call gets 401 and changes nothing), and the
controller sends it on every call to a worker. One call at a time per session: a second interact or
expert while one is in flight gets 409 `busy` here, without reaching the worker.

Counting: each failure once, by class (`errors_by_class` in /status). A session ended as env_error is
counted under the cause that ended it (worker_died, worker_timeout, worker_failed, worker_garbled,
worker_lost, idle_expired, or env_error when the worker itself ended it: a task that raised or timed
out there); a start_sample that failed counts as start_failed, an unhandled error of ours as internal.
A caller that hangs up mid-request is `client_disconnects`, not an error; forged calls are
`unauthorized`; refused concurrent calls are `busy`.

The hot path (interact) forwards the client's request body to the worker as the same bytes and the
worker's answer back as the same bytes: it parses each once, to route and to check it, and serializes
nothing. Not here: the state and routing rule (`registry.py`), process setup, signals and logging
(`jobs/controller.py`).
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Coroutine
from typing import Any
from urllib.parse import urlencode

from aiohttp import web
from aiohttp.typedefs import Middleware

from agentrl.config import ControllerConfig
from agentrl.serving.controller.registry import Ended, LatencyStats, Registry, WorkerEntry
from agentrl.serving.controller.worker_client import Failed, TimedOut, Unreachable, WorkerClient
from agentrl.serving.listener import GUARD_KEY, ConnectionGuard, ConnectionLimits, GuardedSite, runner_args
from agentrl.serving.wire import Handler, auth_middleware, check_exposure, error_response, parse_json, read_body
from agentrl.serving.wire_types import EnvError, InteractResult, require, shown
from agentrl.types import Status

log = logging.getLogger(__name__)

SESSION_ROUTES = ("/start_sample", "/interact", "/cancel", "/expert", "/indices", "/touch")
WORKER_S = web.RequestKey("worker_s", float)
"""Seconds a request's handler spent waiting on a worker (the rest is the controller's own overhead)."""
MAX_TOUCH_IDS = 10_000
STATUSES = frozenset(s.value for s in Status)


class WorkerUnreachable(Exception):
    """The worker's socket refused the connection: the process is most likely gone."""


class WorkerFailed(EnvError):
    """The worker timed out, dropped the call or answered something that is not our wire format.

    `cause` is the failure class a session it ends is counted under."""

    def __init__(self, message: str, cause: str = "worker_failed") -> None:
        super().__init__("env_error", message)
        self.cause = cause


def _is_interact_answer(d: Any) -> bool:
    return (isinstance(d, dict) and isinstance(d.get("messages"), list) and isinstance(d.get("done"), bool)
            and isinstance(d.get("reward"), int | float) and d.get("status") in STATUSES)


def _is_start_answer(d: Any) -> bool:
    return (isinstance(d, dict) and isinstance(d.get("session_id"), str) and isinstance(d.get("messages"), list)
            and isinstance(d.get("tools"), list))


class Controller:
    def __init__(self, cfg: ControllerConfig, secret: str | None = None) -> None:
        self.cfg = cfg
        self.secret = secret
        self.guard = ConnectionGuard(ConnectionLimits.of(cfg), secret, self._unauthorized)
        """Connections by state (the listener closes what a flooder holds before the secret is seen)."""
        self.registry = Registry()
        self.latency = LatencyStats()
        self.route_latency = {route: LatencyStats(window=2_000) for route in SESSION_ROUTES}
        self.overhead = LatencyStats()
        self.failures = {"start_failed": 0, "internal": 0}
        """Failures that are not a session ending (those are `registry.ended_by`)."""
        self.counters = {"client_disconnects": 0, "unauthorized": 0, "busy": 0}
        """Refused or abandoned calls: not failures of ours."""
        self.in_flight: set[str] = set()
        """Sessions with an interact or expert call being forwarded: one at a time."""
        self.indices_cache: dict[tuple[str, str], list[str]] = {}
        self.worker_client: WorkerClient | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._last_idle_sweep = time.monotonic()

    def _unauthorized(self) -> None:
        self.counters["unauthorized"] += 1

    # ---------------------------------------------------------------------------------- lifecycle
    async def on_startup(self, app: web.Application) -> None:
        # A socket is held only while a call runs, so 1024 per worker cover 10,000 sessions with room
        # to spare; keep-alive reuses them, which is most of what makes a forwarded call cheap.
        self.worker_client = WorkerClient(timeout_s=self.cfg.request_timeout_s, limit=1024, secret=self.secret)
        self._spawn(self._janitor())

    async def on_cleanup(self, app: web.Application) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self.worker_client is not None:
            self.worker_client.close()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)  # keep a reference: the loop holds tasks only weakly
        task.add_done_callback(self._background.discard)

    async def _janitor(self) -> None:
        cfg = self.cfg
        period = min(cfg.heartbeat_s, cfg.dead_after_s / 2, cfg.session_idle_s / 2)
        due = time.monotonic() + period
        while True:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            now = time.monotonic()
            late, due = now - due, now + period
            try:
                if late > period:
                    # This loop did not run for `late` seconds (a loaded node, a GC pause, the process
                    # descheduled): heartbeats and calls that arrived meanwhile are still unread, so that
                    # time is not the workers' or the sessions' silence.
                    self.registry.excuse(late, now)
                    log.info("controller loop stalled %.2fs: not counted against workers or sessions", late)
                self._sweep()
            except Exception:  # a bug here must not stop expiry for the rest of the run
                log.exception("controller sweep failed")

    def _sweep(self) -> None:
        cfg = self.cfg
        now = time.monotonic()
        # The scan over sessions is the one step that grows with their number: run it every 1/20 of
        # the idle limit (a session expires at most 5% late), not every heartbeat.
        scan = now - self._last_idle_sweep >= cfg.session_idle_s / 20
        if scan:
            self._last_idle_sweep = now
        dead, idle = self.registry.expire(now, cfg.dead_after_s, cfg.session_idle_s,
                                          tombstone_ttl_s=max(cfg.session_idle_s, 600.0), sessions=scan)
        for wid in dead:
            log.warning("worker %s missed heartbeats for %.1fs: declared dead", wid, cfg.dead_after_s)
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
                       params: dict[str, str] | None = None, raw: bytes | None = None) -> tuple[int, Any, bytes]:
        """One call to a worker → (HTTP status, parsed JSON answer, answer bytes).

        `raw` is sent as the body unchanged (the hot path); else `body` is serialized.
        Raises WorkerUnreachable (connection refused) or WorkerFailed (timeout, dropped call, not JSON).
        """
        assert self.worker_client is not None
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        try:
            status, out = await self.worker_client.request(worker.address, method,
                                                      f"{route}?{urlencode(params)}" if params else route, data)
        except Unreachable as e:
            raise WorkerUnreachable(f"worker {worker.worker_id} unreachable on {route}: {e}") from e
        except Failed as e:
            raise WorkerFailed(f"worker {worker.worker_id} failed on {route}: {e}",
                               "worker_timeout" if isinstance(e, TimedOut) else "worker_failed") from e
        try:
            return status, json.loads(out), out
        except (ValueError, RecursionError):
            raise WorkerFailed(f"worker {worker.worker_id} sent a non-JSON answer on {route} "
                               f"(HTTP {status}: {out[:100]!r})", "worker_garbled") from None

    def _worker_down(self, worker: WorkerEntry, err: Exception) -> None:
        log.warning("%s: declared dead", err)
        self.registry.mark_dead(worker.worker_id, str(err), time.monotonic())  # its sessions count as worker_died

    def _worker_failed(self, worker: WorkerEntry, err: Exception) -> None:
        """One more failed call; enough in a row and the worker is declared dead (its sessions end)."""
        worker.failures += 1
        log.warning("%s (%d in a row)", err, worker.failures)
        if worker.failures >= self.cfg.max_worker_failures and worker.alive:
            self._worker_down(worker, EnvError("env_error", f"worker {worker.worker_id} failed "
                                                            f"{worker.failures} calls in a row; last: {err}"))

    def _session(self, sid: str) -> tuple[WorkerEntry | None, Ended | None]:
        """(owning worker, None) for a live session, (None, why) for one that ended; else 404."""
        entry = self.registry.sessions.get(sid)
        if entry is not None:
            entry.last_used = time.monotonic()
            return self.registry.workers[entry.worker_id], None
        ended = self.registry.tombstones.get(sid)
        if ended is not None:
            return None, ended
        raise EnvError("unknown_session", f"no session {shown(sid)}")

    # ---------------------------------------------------------------------------------- sessions
    async def start_sample(self, request: web.Request) -> web.Response:
        try:
            return await self._start_sample(request)
        except EnvError as e:
            if e.code == "env_error":  # counted: no session came of it (no_capacity is back-pressure, not this)
                self.failures["start_failed"] += 1
            raise

    async def _start_sample(self, request: web.Request) -> web.Response:
        raw = await self._read(request)
        body = parse_json(raw)
        task, _ = require(body, "task"), require(body, "index")
        tried: set[str] = set()
        last: EnvError | None = None
        in_workers = 0.0
        while True:
            try:
                worker = self.registry.pick(task, exclude=tried)
            except EnvError as e:
                raise (last if last is not None and e.code == "no_capacity" else e) from None
            tried.add(worker.worker_id)
            worker.pending += 1
            t0 = time.perf_counter()
            try:
                status, data, out = await self._forward(worker, "POST", "/start_sample", raw=raw)
            except WorkerUnreachable as e:
                self._worker_down(worker, e)
                continue
            except WorkerFailed as e:  # another worker may answer
                self._worker_failed(worker, e)
                last = e
                continue
            finally:
                worker.pending -= 1
                in_workers += time.perf_counter() - t0
                request[WORKER_S] = in_workers
            if status == 200 and _is_start_answer(data):
                worker.failures = 0
                if not worker.alive:  # declared dead while the call ran: the session is lost with it
                    last = EnvError("env_error", f"worker {worker.worker_id} died during start_sample")
                    continue
                self.registry.add_session(data["session_id"], task, worker.worker_id, time.monotonic())
                return web.Response(body=out, content_type="application/json")
            if status == 200 or not (isinstance(data, dict) and isinstance(data.get("error"), dict)):
                err = WorkerFailed(f"worker {worker.worker_id} sent a malformed start_sample answer "
                                   f"(HTTP {status}: {out[:100]!r})", "worker_garbled")
                self._worker_failed(worker, err)
                last = err
                continue
            worker.failures = 0
            err = EnvError.from_wire(data, status)
            if err.code != "no_capacity":  # the sample's own problem (bad index, task failure): no retry
                raise err
            last = err  # the worker is fuller than we counted (or draining): try the next one

    async def _read(self, request: web.Request) -> bytes:
        return await read_body(request, self.cfg.max_body_bytes, self.cfg.body_timeout_s)

    def _claim(self, sid: str) -> None:
        """Mark a session's call in flight; a second one while it runs is the caller's mistake: busy."""
        if sid in self.in_flight:
            self.counters["busy"] += 1
            raise EnvError("busy", f"session {sid} is already running a call; send one call at a time")
        self.in_flight.add(sid)

    async def interact(self, request: web.Request) -> web.Response:
        raw = await self._read(request)
        body = parse_json(raw)
        sid = require(body, "session_id")
        require(body, "message", dict)
        worker, ended = self._session(sid)
        if worker is None:
            assert ended is not None
            return web.json_response(InteractResult.ended(ended.status, ended.reason).to_wire())
        self._claim(sid)
        try:
            return await self._interact(request, raw, sid, worker)
        finally:
            self.in_flight.discard(sid)

    async def _interact(self, request: web.Request, raw: bytes, sid: str, worker: WorkerEntry) -> web.Response:
        t0 = time.perf_counter()
        try:
            status, data, out = await self._forward(worker, "POST", "/interact", raw=raw)
        except WorkerUnreachable as e:
            self._worker_down(worker, e)
            return self._end_with_error(sid, str(e), "worker_died")
        except WorkerFailed as e:
            answer = self._end_with_error(sid, e.message, e.cause)  # counted under its own cause first
            self._worker_failed(worker, e)
            self._spawn(self._quiet_cancel(worker, sid))  # the episode's state there is unknown: free it
            return answer
        finally:
            request[WORKER_S] = time.perf_counter() - t0
        if status == 200 and _is_interact_answer(data):
            worker.failures = 0
            if data["done"] and data["status"] == Status.ENV_ERROR.value:  # the worker ended it: say so later too
                reason = str(data.get("error") or f"worker {worker.worker_id} ended the session")
                self.registry.end_session(sid, Ended(Status.ENV_ERROR, reason, time.monotonic(), "env_error"))
            elif data["done"]:
                self.registry.end_session(sid)
            return web.Response(body=out, content_type="application/json")
        if status == 200 or not (isinstance(data, dict) and isinstance(data.get("error"), dict)):
            err = WorkerFailed(f"worker {worker.worker_id} sent a malformed interact answer "
                               f"(HTTP {status}: {out[:100]!r})", "worker_garbled")
            answer = self._end_with_error(sid, err.message, err.cause)
            self._worker_failed(worker, err)
            self._spawn(self._quiet_cancel(worker, sid))
            return answer
        worker.failures = 0
        err = EnvError.from_wire(data, status)
        if err.code == "unknown_session":  # the worker lost it (restart, its own expiry): infrastructure
            return self._end_with_error(sid, f"worker {worker.worker_id} lost the session", "worker_lost")
        raise err

    def _end_with_error(self, sid: str, reason: str, cause: str) -> web.Response:
        """End a live session as env_error (counted under `cause`, once) and answer its interact so."""
        ended = self.registry.tombstones.get(sid)
        if sid in self.registry.sessions or ended is None:
            ended = Ended(Status.ENV_ERROR, reason, time.monotonic(), cause)
            self.registry.end_session(sid, ended)
        return web.json_response(InteractResult.ended(ended.status, reason).to_wire())

    async def cancel(self, request: web.Request) -> web.Response:
        sid = require(parse_json(await self._read(request)), "session_id")
        worker, _ = self._session(sid)
        if worker is not None:
            self.registry.end_session(sid)
            t0 = time.perf_counter()
            try:
                await self._forward(worker, "POST", "/cancel", {"session_id": sid})
            except WorkerUnreachable as e:
                self._worker_down(worker, e)
            except WorkerFailed as e:  # the session is gone here; the worker's idle check frees its slot
                self._worker_failed(worker, e)
            request[WORKER_S] = time.perf_counter() - t0
        return web.json_response({"ok": True})

    async def expert(self, request: web.Request) -> web.Response:
        sid = require(parse_json(await self._read(request)), "session_id")
        worker, ended = self._session(sid)
        if worker is None:
            assert ended is not None
            raise EnvError("env_error", f"session ended: {ended.reason}")
        self._claim(sid)
        try:
            return await self._expert(request, sid, worker)
        finally:
            self.in_flight.discard(sid)

    async def _expert(self, request: web.Request, sid: str, worker: WorkerEntry) -> web.Response:
        t0 = time.perf_counter()
        try:
            status, data, out = await self._forward(worker, "POST", "/expert", {"session_id": sid})
        except WorkerUnreachable as e:
            self._worker_down(worker, e)
            raise EnvError("env_error", str(e)) from e
        except WorkerFailed as e:
            self._worker_failed(worker, e)
            raise
        finally:
            request[WORKER_S] = time.perf_counter() - t0
        if status != 200:
            raise EnvError.from_wire(data, status)
        if not (isinstance(data, dict) and isinstance(data.get("message"), dict)):
            raise WorkerFailed(f"worker {worker.worker_id} sent a malformed expert answer", "worker_garbled")
        return web.Response(body=out, content_type="application/json")

    async def indices(self, request: web.Request) -> web.Response:
        task, split = request.query.get("task", ""), request.query.get("split", "")
        key = (task, split)
        if key not in self.indices_cache:
            worker = self.registry.any_worker(task)
            try:
                status, data, _ = await self._forward(worker, "GET", "/indices", params={"task": task, "split": split})
            except WorkerUnreachable as e:
                self._worker_down(worker, e)
                raise EnvError("env_error", str(e)) from e
            if status != 200:
                raise EnvError.from_wire(data, status)
            if not (isinstance(data, dict) and isinstance(data.get("indices"), list)):
                raise WorkerFailed(f"worker {worker.worker_id} sent a malformed indices answer")
            self.indices_cache[key] = [str(i) for i in data["indices"]]
        return web.json_response({"indices": self.indices_cache[key]})

    async def touch(self, request: web.Request) -> web.Response:
        """A client's keep-alive for the sessions it holds; answers which of them are not live."""
        ids = require(parse_json(await self._read(request)), "session_ids", list)
        if len(ids) > MAX_TOUCH_IDS or not all(isinstance(i, str) for i in ids):
            raise EnvError("bad_request", f"session_ids must be at most {MAX_TOUCH_IDS} strings")
        return web.json_response({"missing": self.registry.touch(ids, time.monotonic())})

    async def status(self, request: web.Request) -> web.Response:
        return web.json_response(self.status_dict())

    def status_dict(self) -> dict[str, Any]:
        """What GET /status answers (also what `stats.log_periodically` logs to TensorBoard)."""
        reg, now = self.registry, time.monotonic()
        return {
            "workers": [{**w.to_wire(), "heartbeat_age_s": round(now - w.last_heartbeat, 3)}
                        for w in sorted(reg.workers.values(), key=lambda w: w.worker_id)],
            "sessions": reg.sessions_per_task(), "active_sessions": len(reg.sessions),
            "latency_ms": self.latency.summary(),
            "latency_ms_by_route": {r.lstrip("/"): s.summary() for r, s in self.route_latency.items() if s.samples},
            "overhead_ms": self.overhead.summary(),
            "errors": sum(self.errors_by_class().values()), "errors_by_class": self.errors_by_class(),
            **self.counters, "ended_sessions": len(reg.tombstones), "connections": self.guard.stats()}

    def errors_by_class(self) -> dict[str, int]:
        """Each failure once: sessions ended as env_error by cause, failed starts, our own bugs."""
        return {**self.registry.ended_by, **self.failures}

    # ---------------------------------------------------------------------------------- workers
    async def register(self, request: web.Request) -> web.Response:
        body = parse_json(await self._read(request))
        worker_id, address = require(body, "worker_id"), require(body, "address")
        tasks, slots = require(body, "tasks", list), require(body, "slots", int)
        listed = body.get("sessions") or []
        if not isinstance(listed, list):
            raise EnvError("bad_request", "sessions must be a list")
        sessions = [(require(s, "session_id"), require(s, "task")) for s in listed]
        drop = self.registry.register(worker_id, address, [str(t) for t in tasks], slots, sessions, time.monotonic(),
                                      draining=bool(body.get("draining", False)))
        log.info("worker %s registered at %s: tasks %s, %d slots", worker_id, address, tasks, slots)
        return web.json_response({"ok": True, "drop": drop})

    async def heartbeat(self, request: web.Request) -> web.Response:
        body = parse_json(await self._read(request))
        worker_id = require(body, "worker_id")
        active = body.get("active", 0)
        unhealthy = body.get("unhealthy") or {}
        unhealthy = {str(k)[:200]: str(v)[:300] for k, v in unhealthy.items()} if isinstance(unhealthy, dict) else {}
        known = self.registry.heartbeat(worker_id, active if isinstance(active, int) else 0,
                                        bool(body.get("draining", False)), time.monotonic(), unhealthy)
        idle = body.get("idle") or []
        drop = self.registry.not_held(worker_id, [i for i in idle if isinstance(i, str)]) \
            if known and isinstance(idle, list) else []
        return web.json_response({"ok": known, "reregister": not known, "drop": drop})

    async def drain(self, request: web.Request) -> web.Response:
        """Stop routing new sessions to a worker and tell it to refuse them; its own run to their end."""
        worker_id = require(parse_json(await self._read(request)), "worker_id")
        worker = self.registry.workers.get(worker_id)
        if worker is None:
            raise EnvError("not_found", f"no worker {shown(worker_id)}")
        worker.draining = True
        if worker.alive:
            try:  # so its heartbeats keep saying so; if it cannot hear us the flag here still holds
                await self._forward(worker, "POST", "/drain", {})
            except WorkerUnreachable as e:
                self._worker_down(worker, e)
            except WorkerFailed as e:
                self._worker_failed(worker, e)
        return web.json_response({"ok": True, "worker_id": worker_id, "active": len(worker.sessions)})


CONTROLLER_KEY = web.AppKey("controller", Controller)


def _make_middleware(controller: Controller) -> Middleware:
    timed = {route: controller.route_latency[route] for route in SESSION_ROUTES}

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Time session-route calls; turn any failure into a JSON error for this request only."""
        t0 = time.perf_counter()
        try:
            return await handler(request)
        except ConnectionResetError:  # the caller hung up mid-request: not our failure, nobody to answer
            controller.counters["client_disconnects"] += 1
            return web.Response(status=499)
        except Exception as e:
            response = error_response(e, request, unhandled_code="internal")
            if not isinstance(e, EnvError | web.HTTPException):  # a bug of ours (logged by error_response)
                controller.failures["internal"] += 1
            return response
        finally:
            stats = timed.get(request.path)
            if stats is not None:
                ms = (time.perf_counter() - t0) * 1000.0
                stats.record(ms)
                controller.latency.record(ms)
                in_workers = request.get(WORKER_S)
                if in_workers is not None:
                    controller.overhead.record(ms - in_workers * 1000.0)
    return middleware


def create_controller_app(cfg: ControllerConfig, secret: str | None = None) -> web.Application:
    """The controller as an aiohttp app (serve it with web.AppRunner; `start_controller` does).

    `secret`: required on every route and sent to the workers; None only for in-process loopback tests.
    """
    controller = Controller(cfg, secret)

    app = web.Application(middlewares=[auth_middleware(secret, controller._unauthorized, controller.guard.trust),
                                       _make_middleware(controller)], client_max_size=cfg.max_body_bytes)
    app[CONTROLLER_KEY] = controller
    app[GUARD_KEY] = controller.guard
    app.on_startup.append(controller.on_startup)
    app.on_cleanup.append(controller.on_cleanup)
    app.add_routes([
        web.post("/start_sample", controller.start_sample), web.post("/interact", controller.interact),
        web.post("/cancel", controller.cancel), web.post("/expert", controller.expert),
        web.get("/indices", controller.indices), web.post("/touch", controller.touch),
        web.get("/status", controller.status), web.post("/drain", controller.drain),
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


async def start_controller(cfg: ControllerConfig, advertise_host: str | None = None,
                           secret: str | None = None) -> RunningController:
    """Serve the controller on cfg.host:cfg.port (port 0: a free one); the URL uses `advertise_host`.

    `secret`: the run's secret (`agentrl.auth.run_secret`); None only on loopback (refused elsewhere).
    """
    check_exposure(cfg.host, secret)
    app = create_controller_app(cfg, secret)
    runner = web.AppRunner(app, **runner_args(cfg))
    await runner.setup()
    site = GuardedSite(runner, cfg.host, cfg.port, app[GUARD_KEY], backlog=4096)
    await site.start()
    return RunningController(runner, f"http://{advertise_host or cfg.host}:{site.port}")
