"""The env client: the async HTTP client of the session routes, what the rollout, the evaluation and the checks use (the
controller has its own client towards the workers: `agentrl.serving.controller.worker_client`).

One `aiohttp.ClientSession` per client, created on first use inside the running event loop, with a
connection limit large enough for thousands of concurrent agent loops. Every failure surfaces as
`EnvError`: the server's own error code when it answered, "env_error" for connection failures and
timeouts; an answer that is not the wire format is an env_error too, never a KeyError.

Keep-alive: the client remembers the sessions it started and has not seen end, and while it holds any
it touches them all (POST /touch, in batches) every `keepalive_s`. The controller expires a session
only after `session_idle_s` without a call or a touch, so a session whose agent loop waits on a slow
generation or a weight sync is never expired while this process runs; one whose process died is.

Every request carries the run's secret (`agentrl.auth`): the one given, else `$AGENTRL_SECRET`.

Not here: retries (the caller decides whether an env_error episode is retried or dropped).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from types import TracebackType
from typing import Any, Self

import aiohttp

from agentrl.auth import ENV_VAR, auth_header
from agentrl.serving.wire_types import InteractResult, StartResult
from agentrl.tasks.api import EnvError

log = logging.getLogger(__name__)
TOUCH_BATCH = 5_000


class EnvClient:
    """Client of the session routes (start_sample, interact, cancel, expert, indices, status).

    Usage:
        async with EnvClient("http://127.0.0.1:8000", secret=run_secret(run_dir)) as env:
            start = await env.start_sample("lookup", "train-0")
            result = await env.interact(start.session_id, assistant_message)
    """

    def __init__(self, base_url: str, timeout_s: float = 60.0, max_connections: int = 1024,
                 keepalive_s: float | None = 30.0, secret: str | None = None) -> None:
        """`keepalive_s`: how often to touch the held sessions (None: never; e.g. a worker's own URL).
        `secret`: the run's secret (default `$AGENTRL_SECRET`; none for an in-process test server)."""
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self.keepalive_s = keepalive_s
        self.headers = auth_header(secret or os.environ.get(ENV_VAR, "").strip() or None)
        self._http: aiohttp.ClientSession | None = None
        self.held: set[str] = set()
        """Sessions started here and not yet seen to end: what the keep-alive touches."""
        self._keepalive: asyncio.Task[None] | None = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=self.max_connections)
            self._http = aiohttp.ClientSession(connector=connector, headers=self.headers,
                                               timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        return self._http

    async def _call(self, method: str, route: str, body: dict[str, Any] | None = None,
                    params: dict[str, str] | None = None) -> dict[str, Any]:
        url = f"{self.base_url}{route}"
        try:
            async with self._session().request(method, url, json=body, params=params) as resp:
                try:
                    data = await resp.json(content_type=None)
                except (ValueError, RecursionError):  # not JSON, or nested past the parser's recursion
                    data = (await resp.text(errors="replace"))[:1000]
                if resp.status != 200:
                    raise EnvError.from_wire(data, resp.status)
                if not isinstance(data, dict):
                    raise EnvError("env_error", f"{route}: expected a JSON object, got {str(data)[:200]}")
                return data
        except (TimeoutError, aiohttp.ClientError) as e:
            raise EnvError("env_error", f"{method} {url} failed: {type(e).__name__}: {e}") from e

    async def start_sample(self, task: str, index: str) -> StartResult:
        data = await self._call("POST", "/start_sample", {"task": task, "index": index})
        start = _parse(StartResult.from_wire, data, "start_sample")
        self.held.add(start.session_id)
        if self.keepalive_s and (self._keepalive is None or self._keepalive.done()):
            self._keepalive = asyncio.create_task(self._keepalive_loop(self.keepalive_s))
        return start

    async def interact(self, session_id: str, message: dict[str, Any]) -> InteractResult:
        data = await self._call("POST", "/interact", {"session_id": session_id, "message": message})
        result = _parse(InteractResult.from_wire, data, "interact")
        if result.done:
            self.held.discard(session_id)
        return result

    async def cancel(self, session_id: str) -> None:
        self.held.discard(session_id)
        await self._call("POST", "/cancel", {"session_id": session_id})

    async def touch(self, session_ids: list[str]) -> list[str]:
        """Keep sessions alive; returns those that are not live any more (ended or unknown)."""
        missing: list[str] = []
        for i in range(0, len(session_ids), TOUCH_BATCH):
            data = await self._call("POST", "/touch", {"session_ids": session_ids[i: i + TOUCH_BATCH]})
            missing += [str(s) for s in data.get("missing") or []]
        return missing

    async def _keepalive_loop(self, period_s: float) -> None:
        while self.held:
            await asyncio.sleep(period_s)
            try:
                for sid in await self.touch(list(self.held)):
                    self.held.discard(sid)  # ended without us hearing (expired, worker died): stop touching
            except EnvError as e:  # the controller may be restarting: try again next period
                log.warning("keep-alive of %d sessions failed: %s", len(self.held), e)

    async def drain(self, worker_id: str) -> dict[str, Any]:
        """Ask the controller to drain a worker: no new sessions there, its own run to their end."""
        return await self._call("POST", "/drain", {"worker_id": worker_id})

    async def expert(self, session_id: str) -> dict[str, Any]:
        """The assistant message the task's scripted expert would send now."""
        return dict((await self._call("POST", "/expert", {"session_id": session_id}))["message"])

    async def indices(self, task: str, split: str, wait_s: float = 120.0, poll_s: float = 0.5) -> list[str]:
        """The sample indices of `task`'s `split`. The controller knows them from its workers: while none has
        registered (roles started together, as a requeued Slurm job starts them) it answers no_capacity, and
        this waits up to `wait_s` for one."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return list((await self._call("GET", "/indices", params={"task": task, "split": split}))["indices"])
            except EnvError as e:
                if e.code != "no_capacity" or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(poll_s)

    async def status(self) -> dict[str, Any]:
        return await self._call("GET", "/status")

    async def close(self) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keepalive
            self._keepalive = None
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()


def _parse(fn: Any, data: dict[str, Any], route: str) -> Any:
    try:
        return fn(data)
    except (KeyError, TypeError, ValueError) as e:
        raise EnvError("env_error", f"{route}: malformed answer ({type(e).__name__}: {e}): {str(data)[:200]}") from e
