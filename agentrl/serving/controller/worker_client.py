"""The controller's HTTP/1.1 client towards its workers: pooled keep-alive connections, nothing else.

Why not aiohttp's client: every forwarded call pays for it twice per hop, and its generality (cookies,
redirects, proxies, auth, chunked bodies, headers as multidicts) is a third of the controller's CPU
per interaction in a profile. The workers are ours and always answer with a Content-Length body, so
this client writes one request per connection at a time and reads exactly that: a status line,
headers, `Content-Length` bytes. Anything else (chunked encoding, a missing length, a malformed
status line, a connection closed mid-answer) is a failed call, as is a timeout.

Errors: `Unreachable` when a connection cannot be made (the worker process is most likely gone),
`Failed` for everything after that. A pooled connection that the worker closed while it sat idle is
detected and dropped; if a reused connection is closed before a single byte of the answer arrived,
the call is sent once more on a fresh one (the worker closed it without reading the request: its
keep-alive ran out). Idle connections are closed after `idle_s`, well before aiohttp's server closes
them (75 s), which keeps that race rare.
"""
from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from urllib.parse import urlsplit

from agentrl.auth import auth_header

HEADER_LIMIT = 64 * 1024


class WorkerCallError(Exception):
    pass


class Unreachable(WorkerCallError):
    """No connection could be made."""


class Failed(WorkerCallError):
    """The call was sent (or the connection was open) but no well-formed answer came back in time."""


class TimedOut(Failed):
    """No whole answer within the timeout."""


class _Closed(Failed):
    """Closed by the peer before any byte of the answer: the request may be retried on a fresh socket."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection; answers one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes, bool]] | None = None
        self.closed = False
        self.idle_since = time.monotonic()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports do not subclass asyncio's

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            kind = _Closed if not self.buffer else Failed
            self.waiter.set_exception(kind(f"connection closed by the worker{f': {exc}' if exc else ''}"))

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.waiter is None or self.waiter.done():  # bytes nobody asked for: out of step, never reuse it
            self.close()
            return
        try:
            answer = self._parse()
        except Failed as e:
            self.waiter.set_exception(e)
            return
        if answer is not None:
            self.waiter.set_result(answer)

    def _parse(self) -> tuple[int, bytes, bool] | None:
        """(status, body, keep-alive) once the whole answer is in the buffer, else None."""
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > HEADER_LIMIT:
                raise Failed("answer headers too long")
            return None
        head = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
        parts = head[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise Failed(f"malformed status line {head[0][:80]!r}")
        length, keep_alive = None, parts[0] == "HTTP/1.1"
        for line in head[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                if not value.strip().isdigit():
                    raise Failed(f"bad Content-Length {value.strip()[:20]!r}")
                length = int(value)
            elif name == "transfer-encoding":
                raise Failed(f"unsupported Transfer-Encoding {value.strip()[:20]!r}")
            elif name == "connection":
                keep_alive = value.strip().lower() == "keep-alive" or (keep_alive and value.strip().lower() != "close")
        if length is None:
            raise Failed("answer without Content-Length")
        start = end + 4
        if len(self.buffer) < start + length:
            return None
        if len(self.buffer) > start + length:
            raise Failed("more bytes than the answer's Content-Length")
        return int(parts[1]), bytes(self.buffer[start:start + length]), keep_alive

    def send(self, request: bytes) -> asyncio.Future[tuple[int, bytes, bool]]:
        assert self.transport is not None
        self.buffer.clear()
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class WorkerClient:
    """Keep-alive connection pools per worker address ("http://host:port"), at most `limit` per worker."""

    def __init__(self, timeout_s: float, limit: int = 1024, idle_s: float = 15.0, secret: str | None = None) -> None:
        """`secret`: the run's secret, sent with every call (the workers require it)."""
        self.timeout_s = timeout_s
        self.auth = "".join(f"{k}: {v}\r\n" for k, v in auth_header(secret).items())
        self.idle_s = idle_s
        self.limit = limit
        self._idle: dict[tuple[str, int], list[_Connection]] = defaultdict(list)
        self._slots: dict[tuple[str, int], asyncio.Semaphore] = {}
        self._hosts: dict[str, tuple[str, int]] = {}

    def _host(self, address: str) -> tuple[str, int]:
        host = self._hosts.get(address)
        if host is None:
            url = urlsplit(address)
            if url.scheme != "http" or not url.hostname:
                raise Unreachable(f"not an http:// address: {address!r}")
            host = self._hosts[address] = (url.hostname, url.port or 80)
        return host

    async def _connect(self, host: tuple[str, int]) -> _Connection:
        try:
            _, conn = await asyncio.get_running_loop().create_connection(_Connection, *host)
        except OSError as e:
            raise Unreachable(f"cannot connect to {host[0]}:{host[1]}: {e}") from e
        return conn

    def _pooled(self, host: tuple[str, int]) -> _Connection | None:
        idle, now = self._idle[host], time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self.idle_s:
                return conn
            conn.close()
        return None

    async def request(self, address: str, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        """One call; returns (HTTP status, body). Raises Unreachable or Failed (timeouts included)."""
        host = self._host(address)
        head = (f"{method} {path} HTTP/1.1\r\nHost: {host[0]}:{host[1]}\r\n{self.auth}"
                f"Content-Type: application/json\r\nContent-Length: {len(body or b'')}\r\n\r\n").encode()
        request = head + body if body else head
        slots = self._slots.get(host)
        if slots is None:
            slots = self._slots[host] = asyncio.Semaphore(self.limit)
        conn: _Connection | None = None
        try:
            async with asyncio.timeout(self.timeout_s), slots:
                conn = self._pooled(host)
                if conn is not None:
                    try:
                        status, answer, keep_alive = await conn.send(request)
                    except _Closed:  # its keep-alive ran out as we reused it: once more, on a fresh socket
                        conn = None
                if conn is None:
                    conn = await self._connect(host)
                    status, answer, keep_alive = await conn.send(request)
        except TimeoutError:
            if conn is not None:
                conn.close()
            raise TimedOut(f"timed out: no answer within {self.timeout_s:g}s") from None
        except BaseException:  # Failed, or a cancellation: the connection is out of step, never reuse it
            if conn is not None:
                conn.close()
            raise
        conn.waiter = None
        if keep_alive and not conn.closed:
            conn.idle_since = time.monotonic()
            self._idle[host].append(conn)
        else:
            conn.close()
        return status, answer

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
