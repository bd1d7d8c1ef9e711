"""The listener in front of the controller and the workers (`agentrl.serving.listener`): what a connection may
cost before it shows the run's secret. Unit tests of the guard's rule on fake transports, then real sockets
on 127.0.0.1 against a controller and a worker. (On 5d8debb a half-sent request held its socket for an
hour, aiohttp's keep-alive default, and 1,100 of them ran the controller out of descriptors.)"""
from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

from aio_helpers import run, wait_until

from agentrl.config import ControllerConfig, EnvsConfig
from agentrl.serving.client import EnvClient
from agentrl.serving.controller.server import start_controller
from agentrl.serving.listener import PENDING_HEAD_BYTES, ConnectionGuard, ConnectionLimits
from agentrl.serving.worker import start_worker
from agentrl.tasks.lookup import LookupTask

SECRET = "ab" * 32


class FakeTransport:
    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.aborted = False

    def get_extra_info(self, name: str) -> Any:
        return (self.peer, 40000) if name == "peername" else None

    def abort(self) -> None:
        self.aborted = True


def test_a_flooder_evicts_its_own_connections_first() -> None:
    async def main() -> None:
        guard = ConnectionGuard(ConnectionLimits(head_timeout_s=60, pending=3, per_peer=2, grace_s=0.0))
        a1, a2, a3, b1, c1 = (FakeTransport(p) for p in ("a", "a", "a", "b", "c"))
        for t in (a1, a2, b1):
            assert guard.admit(t)
        assert guard.admit(a3)  # a's third: a's oldest makes room, b is not touched
        assert (a1.aborted, a2.aborted, b1.aborted) == (True, False, False)
        assert guard.admit(c1)  # the total (3): the peer holding the most (a) loses its oldest
        assert (a2.aborted, a3.aborted, b1.aborted) == (True, False, False)
        assert {k: v for k, v in guard.stats().items() if k != "oldest_pending_s"} == {
            "open": 3, "pending": 3, "trusted": 0, "head_timeouts": 0, "head_too_long": 0, "evicted": 2, "refused": 0}
        guard.trust(b1)  # b showed the secret: no longer pending, never evicted
        assert guard.stats()["pending"] == 2 and guard.stats()["trusted"] == 1
    run(main())


def test_a_burst_younger_than_the_grace_is_accepted_whole() -> None:
    async def main() -> None:
        guard = ConnectionGuard(ConnectionLimits(head_timeout_s=60, pending=4, per_peer=2, grace_s=30.0))
        burst = [FakeTransport("rollout") for _ in range(10)]
        assert all(guard.admit(t) for t in burst) and not any(t.aborted for t in burst)
        assert guard.pending_total == 10
    run(main())


def test_past_max_connections_pending_go_first_then_newcomers_are_refused() -> None:
    async def main() -> None:
        guard = ConnectionGuard(ConnectionLimits(head_timeout_s=60, pending=10, per_peer=10, max_connections=2))
        kept, waiting = FakeTransport("run"), FakeTransport("flood")
        assert guard.admit(kept) and guard.admit(waiting)
        guard.trust(kept)
        assert guard.admit(FakeTransport("run"))  # the flood's pending one made room, whatever its age
        assert waiting.aborted and not kept.aborted
        guard.trust(next(t for t in guard.conns if t is not kept))
        assert not guard.admit(FakeTransport("run"))  # all trusted: the newcomer is refused
        assert guard.counters["refused"] == 1
    run(main())


def test_pending_connections_are_closed_at_the_head_deadline() -> None:
    async def main() -> None:
        guard = ConnectionGuard(ConnectionLimits(head_timeout_s=0.1))
        slow, quick = FakeTransport("x"), FakeTransport("x")
        guard.admit(slow)
        guard.admit(quick)
        guard.trust(quick)
        await asyncio.sleep(0.3)
        assert slow.aborted and not quick.aborted
        assert guard.counters["head_timeouts"] == 1 and guard.pending_total == 0
    run(main())


# ----------------------------------------------------------------------------------------- real sockets

CFG = ControllerConfig(heartbeat_s=0.1, dead_after_s=3.0, head_timeout_s=0.5)


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5)
    return s


def _closed_within(s: socket.socket, timeout_s: float) -> tuple[bool, bytes]:
    """(whether the server closed `s` within `timeout_s`, what it sent before)."""
    s.settimeout(timeout_s)
    got = b""
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return True, got
            got += data
    except ConnectionResetError:
        return True, got
    except TimeoutError:
        return False, got


def test_half_sent_heads_and_heads_without_the_secret_never_reach_the_handlers() -> None:
    async def main() -> None:
        ctrl = await start_controller(CFG, secret=SECRET)
        worker = await start_worker(EnvsConfig(tasks=("lookup",), expert_route="enabled"), CFG, ctrl.url, "w0",
                                    tasks={"lookup": LookupTask()}, secret=SECRET)
        await wait_until(lambda: "w0" in ctrl.controller.registry.workers)
        for url, guard in ((ctrl.url, ctrl.controller.guard), (worker.address, worker.worker.guard)):
            half = _connect(url)
            half.sendall(b"POST /interact HTTP/1.1\r\nHost: x\r\n")
            huge = _connect(url)
            huge.sendall(b"GET /status HTTP/1.1\r\nX: " + b"a" * (PENDING_HEAD_BYTES + 10))
            forged = _connect(url)
            forged.sendall(b"POST /drain HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + b"0" * 64
                           + b"\r\nContent-Length: 100000\r\n\r\n{")
            t0 = time.monotonic()
            closed = await asyncio.gather(*(asyncio.to_thread(_closed_within, s, 5.0) for s in (half, huge, forged)))
            for s in (half, huge, forged):
                s.close()
            assert [c for c, _ in closed] == [True, True, True]
            assert time.monotonic() - t0 < CFG.head_timeout_s + 2.0
            head, _, body = closed[2][1].partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 401") and json.loads(body)["error"]["code"] == "unauthorized"
            assert guard.counters["head_timeouts"] >= 1 and guard.counters["head_too_long"] == 1
        assert ctrl.controller.counters["unauthorized"] == 1 and worker.worker.counters["unauthorized"] == 1
        assert not ctrl.controller.registry.workers["w0"].draining  # the forged drain did nothing
        async with EnvClient(ctrl.url, secret=SECRET) as env:  # and the run is served as before
            start = await env.start_sample("lookup", "train-0")
            assert not (await env.interact(start.session_id, await env.expert(start.session_id))).done
            status = await env.status()
            assert status["connections"]["trusted"] >= 1 and status["connections"]["pending"] == 0
        await worker.stop()
        await ctrl.stop()
    run(main())


def test_descriptors_past_max_connections_are_refused_at_accept() -> None:
    async def main() -> None:
        cfg = ControllerConfig(heartbeat_s=0.1, dead_after_s=3.0, max_connections=4)
        ctrl = await start_controller(cfg, secret=SECRET)
        held = []
        for _ in range(4):  # four connections that showed the secret: the most this controller holds
            s = _connect(ctrl.url)
            s.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + SECRET.encode() + b"\r\n\r\n")
            held.append(s)
        await wait_until(lambda: ctrl.controller.guard.stats()["trusted"] == 4)
        extra = _connect(ctrl.url)
        closed, _ = await asyncio.to_thread(_closed_within, extra, 3.0)
        assert closed and ctrl.controller.guard.counters["refused"] >= 1
        for s in held + [extra]:
            s.close()
        await ctrl.stop()
    run(main())
