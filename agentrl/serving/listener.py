"""The listening socket of the controller and the env workers: what a connection may cost before it has
shown the run's secret.

On a cluster every user of the partition reaches our ports. aiohttp's server bounds a request head's
size but not how long it may take to arrive, nor how many connections may wait for theirs: 1,100 half-sent
requests once held 1,008 of the controller's sockets for over a minute, it ran out of file descriptors,
stopped accepting (the run's own client got timeouts, then 503) and declared its healthy worker dead.
`GuardedSite` serves an aiohttp runner behind `ConnectionGuard`, which counts every connection from the
moment it is accepted until it has shown the run's secret in a whole request head (`trust`). Until then a
connection is *pending*, and

  * its bytes wait here until its first request head is complete (at most `PENDING_HEAD_BYTES`, or it is
    closed): aiohttp never parses, times or schedules anything for a connection that has not finished a
    head. A complete head without the secret is answered 401 here and closed, before aiohttp makes a
    handler for it (the auth middleware, `wire.py`, checks every later request of a trusted connection);
  * it must be trusted within `head_timeout_s` of its accept, or it is closed (a request head sent one
    byte at a time, or nothing at all);
  * one peer address holds at most `per_peer` pending connections and all peers `pending` together; past
    either, the oldest pending connection of that peer (of the peer holding the most, for the total) is
    closed to make room, so a flooder's own connections make room for the newcomer, never the run's
    clients on other hosts, and a client on the flooder's own host only loses a connection that waited
    longer than any of the flooder's newer ones (its head normally arrives in a millisecond). Connections
    younger than `grace_s` are not evicted for these two caps: a client opening a thousand connections
    at once (the rollout starting its episodes) is accepted whole, then each sends its head at once;
  * every connection, trusted or not, counts toward `max_connections` (by default half the process's
    file-descriptor limit, which `raise_fd_limit` lifts to the hard limit first): past it the oldest
    pending one of the fullest peer is closed whatever its age, or the newcomer when none is pending,
    so accept() never fails for want of descriptors. `GuardedSite` accepts at most `ACCEPT_BATCH` per
    wake-up, so a flood of new connections takes a bounded share of each event-loop turn.

The secret is checked before any body is read, so without it nobody sends a slow body or reads a long
answer slowly. A trusted connection's next request head must arrive within aiohttp's keep-alive timeout
(`idle_timeout_s`), and its body within `body_timeout_s` (`wire.read_body`).

Counted in the servers' /status under `connections`: open, pending, trusted, the oldest pending's age, and
how many were closed for their head deadline (`head_timeouts`), a head past `PENDING_HEAD_BYTES`
(`head_too_long`), a pending cap (`evicted`) or refused at the total (`refused`). The floods of
`jobs.attack_check --tasks http` (`agentrl.checks.attacks.flood`) play against all of it.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web

from agentrl.auth import SCHEME
from agentrl.serving.process import raise_fd_limit

log = logging.getLogger(__name__)

MAX_HEADERS = 32
"""Header fields one request may carry (our clients send about 8): with aiohttp's 8,190-byte bound per
line, a trusted connection's head costs at most ~260 KB of memory."""
_REFUSAL = json.dumps({"error": {"code": "unauthorized",
                                  "message": "missing or wrong run secret (Authorization: Bearer ...)"}}).encode()
UNAUTHORIZED = (b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json; charset=utf-8\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(_REFUSAL), _REFUSAL))
"""What a request head without the secret gets (the auth middleware's answer, written without aiohttp)."""
PENDING_HEAD_BYTES = 16 * 1024
"""The most a connection that has not shown the secret may send before its request head ends (ours send
under 1 KB): past it the connection is closed before aiohttp parses any more of it."""


@dataclass(frozen=True)
class ConnectionLimits:
    head_timeout_s: float = 10.0
    """A connection must send a whole request head with the run's secret within this of its accept."""
    pending: int = 1024
    """Connections of all peers together that have not yet shown the secret."""
    per_peer: int = 256
    """Connections of one peer address that have not yet shown the secret."""
    max_connections: int = 0
    """Every connection, trusted or not (0: half the file-descriptor limit after raising it)."""
    grace_s: float = 1.0
    """A pending connection younger than this is not evicted for the pending caps (a client's burst)."""

    @classmethod
    def of(cls, cfg: Any) -> ConnectionLimits:
        """From a `ControllerConfig` (the controller's and the workers' shared settings)."""
        return cls(cfg.head_timeout_s, cfg.max_pending_connections, cfg.max_pending_per_peer, cfg.max_connections)


class _Sparse(logging.Filter):
    """At most one record per `period_s`, without its traceback, saying how many were left out: aiohttp logs
    every malformed request with a traceback, and a flood of them must not fill the disk or the CPU."""

    def __init__(self, period_s: float = 10.0) -> None:
        super().__init__()
        self.period_s, self.next_t, self.dropped = period_s, 0.0, 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        if now < self.next_t:
            self.dropped += 1
            return False
        self.next_t = now + self.period_s
        if record.exc_info and record.exc_info[1] is not None:
            record.msg = f"{record.msg}: {type(record.exc_info[1]).__name__}: {str(record.exc_info[1])[:200]}"
        record.exc_info = None
        if self.dropped:
            record.msg = f"{record.msg} ({self.dropped} more like it in the last {self.period_s:g} s not logged)"
            self.dropped = 0
        return True


request_log = logging.getLogger("agentrl.serving.listener.requests")
"""aiohttp's server logger for our servers: malformed requests (anyone can send them), sparsely."""


def runner_args(cfg: Any) -> dict[str, Any]:
    """`web.AppRunner` keyword arguments for a `ControllerConfig`: the keep-alive idle limit, head bounds and
    a logger that does not write a traceback per malformed request."""
    if not any(isinstance(f, _Sparse) for f in request_log.filters):
        request_log.addFilter(_Sparse())
    return {"access_log": None, "keepalive_timeout": cfg.idle_timeout_s, "max_headers": MAX_HEADERS,
            "max_line_size": 8190, "max_field_size": 8190, "logger": request_log}


class _Conn:
    """One accepted connection as the guard sees it."""

    __slots__ = ("transport", "peer", "since", "trusted", "timer")

    def __init__(self, transport: asyncio.BaseTransport, peer: str, since: float) -> None:
        self.transport = transport
        self.peer = peer
        self.since = since
        self.trusted = False
        self.timer: asyncio.TimerHandle | None = None


class ConnectionGuard:
    """Counts connections by state and peer, and closes the ones a flooder holds (module docstring).

    `secret`: the run's secret, checked in a connection's first request head before aiohttp sees any of it
    (None: no check, in-process loopback tests); `rejected()` is called for each head without it."""

    def __init__(self, limits: ConnectionLimits | None = None, secret: str | None = None,
                 rejected: Callable[[], None] = lambda: None) -> None:
        self.limits = limits = limits or ConnectionLimits()
        self.expected = (SCHEME + secret).encode() if secret is not None else None
        self.rejected = rejected
        self.max_connections = limits.max_connections or 1 << 30  # resolved by `GuardedSite.start`
        self.conns: dict[asyncio.BaseTransport, _Conn] = {}
        self.pending: dict[str, OrderedDict[_Conn, None]] = {}
        """Per peer address, its pending connections oldest first."""
        self.pending_total = 0
        self.counters = {"head_timeouts": 0, "head_too_long": 0, "evicted": 0, "refused": 0}

    # ------------------------------------------------------------------------------- state changes
    def admit(self, transport: asyncio.BaseTransport) -> bool:
        """A connection was accepted: make room for it, or refuse it (False: the caller aborts it)."""
        peer = _peer(transport)
        now = time.monotonic()
        lim = self.limits
        if len(self.conns) >= self.max_connections and not self._evict(self._fullest(), now, 0.0):
            self.counters["refused"] += 1
            return False
        mine = self.pending.get(peer)
        if mine is not None and len(mine) >= lim.per_peer:
            self._evict(peer, now, lim.grace_s)
        elif self.pending_total >= lim.pending:
            self._evict(self._fullest(), now, lim.grace_s)
        conn = _Conn(transport, peer, now)
        self.conns[transport] = conn
        self.pending.setdefault(peer, OrderedDict())[conn] = None
        self.pending_total += 1
        conn.timer = asyncio.get_running_loop().call_later(lim.head_timeout_s, self._head_timeout, conn)
        return True

    def trust(self, transport: Any) -> None:
        """The connection's request head carried the run's secret: no longer pending."""
        conn = self.conns.get(transport)
        if conn is None or conn.trusted:
            return
        conn.trusted = True
        self._unpend(conn)

    def authorized(self, head: bytes) -> bool:
        """Whether a request head (its bytes up to the blank line) carries the run's secret."""
        if self.expected is None:
            return True
        for line in head.split(b"\r\n")[1:]:
            name, colon, value = line.partition(b":")
            if colon and name.strip().lower() == b"authorization":
                return hmac.compare_digest(value.strip(), self.expected)
        return False

    def refuse(self, transport: asyncio.BaseTransport) -> None:
        """Answer a head without the secret with 401 and close, before aiohttp makes a handler for it."""
        self.rejected()
        conn = self.conns.get(transport)
        if conn is not None:
            self.forget(transport)
        cast(asyncio.WriteTransport, transport).write(UNAUTHORIZED)
        transport.close()

    def head_too_long(self, transport: asyncio.BaseTransport) -> None:
        """A pending connection's first request head ran past `PENDING_HEAD_BYTES`: close it."""
        conn = self.conns.get(transport)
        if conn is not None:
            self.counters["head_too_long"] += 1
            self._close(conn)

    def forget(self, transport: asyncio.BaseTransport) -> None:
        """The connection closed."""
        conn = self.conns.pop(transport, None)
        if conn is not None and not conn.trusted:
            self._unpend(conn)

    # ------------------------------------------------------------------------------- helpers
    def _unpend(self, conn: _Conn) -> None:
        if conn.timer is not None:
            conn.timer.cancel()
            conn.timer = None
        mine = self.pending.get(conn.peer)
        if mine is not None and mine.pop(conn, False) is None:
            self.pending_total -= 1
            if not mine:
                del self.pending[conn.peer]

    def _fullest(self) -> str | None:
        """The peer holding the most pending connections (None: none pending)."""
        return max(self.pending, key=lambda p: len(self.pending[p]), default=None)

    def _evict(self, peer: str | None, now: float, min_age_s: float) -> bool:
        """Close `peer`'s oldest pending connection if it is at least `min_age_s` old; True if one was."""
        mine = self.pending.get(peer) if peer is not None else None
        if not mine:
            return False
        oldest = next(iter(mine))
        if now - oldest.since < min_age_s:
            return False
        self.counters["evicted"] += 1
        self._close(oldest)
        return True

    def _head_timeout(self, conn: _Conn) -> None:
        conn.timer = None
        if not conn.trusted and conn.transport in self.conns:
            self.counters["head_timeouts"] += 1
            self._close(conn)

    def _close(self, conn: _Conn) -> None:
        self.forget(conn.transport)
        conn.transport.abort()  # its descriptor is free at once: no lingering close for a flooder

    def oldest_pending_s(self) -> float:
        """How long the oldest pending connection has waited (0.0: none pending)."""
        first = [next(iter(mine)).since for mine in self.pending.values() if mine]
        return time.monotonic() - min(first) if first else 0.0

    def stats(self) -> dict[str, float]:
        return {"open": len(self.conns), "pending": self.pending_total,
                "trusted": len(self.conns) - self.pending_total, **self.counters,
                "oldest_pending_s": round(self.oldest_pending_s(), 3)}


GUARD_KEY = web.AppKey("connection_guard", ConnectionGuard)
"""Where an app keeps its guard (its auth middleware marks connections trusted; `GuardedSite` serves it)."""


def _peer(transport: asyncio.BaseTransport) -> str:
    name = transport.get_extra_info("peername")
    return str(name[0]) if isinstance(name, tuple) and name else str(name)


class _Guarded(asyncio.Protocol):
    """An aiohttp request handler behind the guard: admitted (or aborted) on accept, forgotten on close.

    The handler is made only when the connection's first request head is complete: until then its bytes
    wait here (at most `PENDING_HEAD_BYTES`), so a connection that never finishes a head costs a buffer,
    never aiohttp's parser, timers and task."""

    __slots__ = ("factory", "inner", "guard", "transport", "live", "head")

    def __init__(self, factory: Callable[[], asyncio.Protocol], guard: ConnectionGuard) -> None:
        self.factory, self.guard = factory, guard
        self.inner: asyncio.Protocol | None = None
        self.transport: asyncio.BaseTransport | None = None
        self.live = False
        self.head = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if not self.guard.admit(transport):
            transport.abort()
            return
        self.live = True

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.guard.forget(self.transport)
        self.live = False
        if self.inner is not None:
            self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)
            return
        if not self.live or self.transport is None:
            return
        start = max(0, len(self.head) - 3)
        self.head += data
        if self.head.find(b"\r\n\r\n", start) < 0:
            if len(self.head) > PENDING_HEAD_BYTES:
                self.live = False
                self.guard.head_too_long(self.transport)
            return
        head, self.head = bytes(self.head), bytearray()
        if not self.guard.authorized(head[:head.find(b"\r\n\r\n")]):
            self.live = False
            self.guard.refuse(self.transport)
            return
        self.guard.trust(self.transport)
        self.inner = self.factory()
        self.inner.connection_made(self.transport)
        self.inner.data_received(head)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()


class GuardedSite(web.BaseSite):
    """An aiohttp runner's server on host:port behind a `ConnectionGuard` (instead of `web.TCPSite`; the
    runner's `cleanup` stops it as it stops any site).

    Its own accept loop rather than `loop.create_server`'s: the kernel's queue of connections waiting to be
    accepted stays long (`backlog`, so a client's connect is not dropped while a flood fills it), but each
    wake-up accepts at most `ACCEPT_BATCH` of them, so a flood of new connections takes a bounded share of
    each event-loop turn and the connections the run already holds (kept alive by its clients, its
    heartbeats, the controller's calls to its workers) are served between them; and an accept that finds
    the descriptors spent pauses for a moment instead of spinning.
    """

    __slots__ = ("guard", "host", "port", "_starting", "_closed")
    ACCEPT_BATCH = 32

    def __init__(self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard,
                 backlog: int = 4096) -> None:
        super().__init__(runner, backlog=backlog)
        self.guard, self.host, self.port = guard, host, port
        self._starting: set[asyncio.Task[Any]] = set()
        self._closed = False

    @property
    def name(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        await super().start()
        limit = raise_fd_limit()
        if not self.guard.limits.max_connections:
            self.guard.max_connections = max(64, limit // 2)
        if self.guard.max_connections < self.guard.limits.pending:
            log.warning("file-descriptor limit %d: at most %d connections, fewer than the %d pending ones "
                        "configured", limit, self.guard.max_connections, self.guard.limits.pending)
        loop = asyncio.get_running_loop()
        sockets = _Sockets()
        self._server = sockets  # type: ignore[assignment]  # what the runner reads: .sockets, .close()
        bound = 0
        for family, kind, proto, _, address in _addresses(self.host, self.port):
            sock = socket.socket(family, kind, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(address[:1] + (bound or address[1],) + address[2:])
                sock.listen(self._backlog)
                sock.setblocking(False)
            except OSError:
                sock.close()
                if sockets.sockets:  # another address of the same name: serve the ones that bound
                    continue
                raise
            bound = bound or sock.getsockname()[1]
            sockets.sockets.append(sock)
            loop.add_reader(sock.fileno(), self._accept, sock)
        self.port = bound

    def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(self.ACCEPT_BATCH):
            if self._closed:
                return
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of descriptors (EMFILE, ENFILE) or buffers: try again in a moment
                request_log.warning("accept failed: %s", e)
                loop.remove_reader(sock.fileno())
                loop.call_later(0.1, self._resume, sock)
                return
            if len(self.guard.conns) + len(self._starting) >= self.guard.max_connections and not self.guard.pending:
                self.guard.counters["refused"] += 1
                conn.close()
                continue
            conn.setblocking(False)
            task = loop.create_task(self._serve(conn))
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)

    def _resume(self, sock: socket.socket) -> None:
        if not self._closed and sock.fileno() >= 0:
            asyncio.get_running_loop().add_reader(sock.fileno(), self._accept, sock)

    async def _serve(self, conn: socket.socket) -> None:
        factory, guard = self._runner.server, self.guard
        assert factory is not None
        try:
            await asyncio.get_running_loop().connect_accepted_socket(lambda: _Guarded(factory, guard), conn)
        except (OSError, RuntimeError):  # the peer left already, or the loop is closing
            conn.close()

    async def stop(self) -> None:
        """Stop accepting (the runner's cleanup then closes the connections)."""
        self._closed = True
        if self._server is not None:
            loop = asyncio.get_running_loop()
            for sock in self._server.sockets:  # type: ignore[union-attr]
                if sock.fileno() >= 0:
                    loop.remove_reader(sock.fileno())
        for task in self._starting:
            task.cancel()
        await super().stop()


class _Sockets:
    """The listening sockets of a `GuardedSite`, as `asyncio.Server` shows them to aiohttp's runner."""

    def __init__(self) -> None:
        self.sockets: list[socket.socket] = []

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


def _addresses(host: str, port: int) -> list[tuple[Any, ...]]:
    """Where to listen for `host` ("" or "0.0.0.0": every IPv4 interface; a name: each of its addresses)."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    seen, out = set(), []
    for info in infos:
        if info[4] not in seen:
            seen.add(info[4])
            out.append(info)
    return out
