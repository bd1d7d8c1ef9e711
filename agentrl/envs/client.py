"""The async HTTP client of the env gateway: what the rollout (and the controller, towards workers) uses.

One `aiohttp.ClientSession` per client, created on first use inside the running event loop, with a
connection limit large enough for thousands of concurrent agent loops. Every failure surfaces as
`EnvError`: the server's own error code when it answered, "env_error" for connection failures and
timeouts. Not here: retries (the caller decides whether an env_error episode is retried or dropped).
"""
from __future__ import annotations

from types import TracebackType
from typing import Any, Self

import aiohttp

from agentrl.envs.api import EnvError, InteractResult, StartResult


class GatewayClient:
    """Client of the gateway routes (start_sample, interact, cancel, expert, indices, status).

    Usage:
        async with GatewayClient("http://127.0.0.1:8000") as env:
            start = await env.start_sample("lookup", "train-0")
            result = await env.interact(start.session_id, assistant_message)
    """

    def __init__(self, base_url: str, timeout_s: float = 60.0, max_connections: int = 10_000) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self._http: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=self.max_connections)
            self._http = aiohttp.ClientSession(connector=connector,
                                               timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        return self._http

    async def _call(self, method: str, route: str, body: dict[str, Any] | None = None,
                    params: dict[str, str] | None = None) -> dict[str, Any]:
        url = f"{self.base_url}{route}"
        try:
            async with self._session().request(method, url, json=body, params=params) as resp:
                try:
                    data = await resp.json(content_type=None)
                except ValueError:
                    data = await resp.text()
                if resp.status != 200:
                    raise EnvError.from_wire(data, resp.status)
                if not isinstance(data, dict):
                    raise EnvError("env_error", f"{route}: expected a JSON object, got {str(data)[:200]}")
                return data
        except (TimeoutError, aiohttp.ClientError) as e:
            raise EnvError("env_error", f"{method} {url} failed: {type(e).__name__}: {e}") from e

    async def start_sample(self, task: str, index: str) -> StartResult:
        return StartResult.from_wire(await self._call("POST", "/start_sample", {"task": task, "index": index}))

    async def interact(self, session_id: str, message: dict[str, Any]) -> InteractResult:
        data = await self._call("POST", "/interact", {"session_id": session_id, "message": message})
        return InteractResult.from_wire(data)

    async def cancel(self, session_id: str) -> None:
        await self._call("POST", "/cancel", {"session_id": session_id})

    async def expert(self, session_id: str) -> dict[str, Any]:
        """The assistant message the task's scripted expert would send now."""
        return dict((await self._call("POST", "/expert", {"session_id": session_id}))["message"])

    async def indices(self, task: str, split: str) -> list[str]:
        return list((await self._call("GET", "/indices", params={"task": task, "split": split}))["indices"])

    async def status(self) -> dict[str, Any]:
        return await self._call("GET", "/status")

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()
