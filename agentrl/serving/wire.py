"""HTTP pieces shared by the env worker and the controller: reading a request, checking its secret,
answering a failure.

Both servers answer every failure of one request with `{"error": {"code", "message"}}` and a status
that matches the code, so a client (and the controller relaying a worker) reads errors one way. A body
is read with a deadline and a size checked before the first byte (a client announcing 10^8 bytes and
sending 7 gets 413 at once; one that stops sending gets 408 after `timeout_s`). Only a body that is not
JSON is "invalid JSON" (400); any other exception a handler raises is a bug, logged and answered 500
(controller) or 502 (worker), and counted by the server.
"""
from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from agentrl.auth import HEADER, authorized
from agentrl.serving.wire_types import SHOWN_CHARS
from agentrl.tasks.api import EnvError

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_MESSAGE_CHARS = 1000
"""An error answer's message is cut to this: no route echoes a large input back."""


async def read_body(request: web.Request, max_bytes: int, timeout_s: float) -> bytes:
    """The request's body: at most `max_bytes` (413 before reading more), within `timeout_s` (408)."""
    announced = request.content_length
    if announced is not None and announced > max_bytes:
        raise web.HTTPRequestEntityTooLarge(max_size=max_bytes, actual_size=announced)
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except TimeoutError:
        raise web.HTTPRequestTimeout(reason=f"the request body did not arrive within {timeout_s:g}s") from None


def parse_json(raw: bytes) -> Any:
    """The body as JSON; only a body that is not JSON (or nested too deep to parse) is bad_request."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise EnvError("bad_request", f"invalid JSON body: {str(e)[:SHOWN_CHARS]}") from None


async def read_json(request: web.Request, max_bytes: int, timeout_s: float) -> Any:
    return parse_json(await read_body(request, max_bytes, timeout_s))


def error_response(e: Exception, request: web.Request, unhandled_code: str) -> web.Response:
    """The JSON error answer for a failed request (shared by the worker and the controller)."""
    if isinstance(e, EnvError):
        err = EnvError(e.code, e.message[:MAX_MESSAGE_CHARS])
        return web.json_response(err.to_wire(), status=e.http_status)
    if isinstance(e, web.HTTPException):
        code = "not_found" if e.status == 404 else "bad_request"
        response = web.json_response(EnvError(code, e.reason).to_wire(), status=e.status)
        if e.status in (408, 413):  # the body was not read to its end: this connection is out of step
            response.force_close()
        return response
    log.exception("unhandled error in %s", request.path)
    err = EnvError(unhandled_code, f"{type(e).__name__}: {str(e)[:SHOWN_CHARS]}")
    return web.json_response(err.to_wire(), status=err.http_status)


def auth_middleware(secret: str | None, rejected: Callable[[], None] = lambda: None,
                    trusted: Callable[[Any], None] = lambda transport: None) -> Middleware:
    """Refuse (401) every request without this run's secret, before reading its body; None: no check.

    `trusted(transport)` is told of each connection whose request carried the secret (the listener's
    guard stops counting it as pending: `agentrl.serving.listener`)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if secret is not None and not authorized(secret, request.headers.get(HEADER)):
            rejected()
            response = web.json_response(
                EnvError("unauthorized", "missing or wrong run secret (Authorization: Bearer ...)").to_wire(),
                status=401)
            response.force_close()  # the body was never read
            return response
        trusted(request.transport)
        return await handler(request)

    return middleware


def check_exposure(host: str, secret: str | None) -> None:
    """Serving without a secret is for in-process tests on loopback only: refuse it on any other interface."""
    if secret is not None:
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise ValueError(f"refusing to serve on {host!r} without a run secret (see agentrl.auth)")
