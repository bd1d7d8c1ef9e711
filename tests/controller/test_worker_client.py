"""The controller's lean HTTP/1.1 client (agentrl/serving/controller/worker_client.py) against real sockets: keep-alive
reuse, its limit, and every malformed or missing answer ending as a clear Failed/Unreachable."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest
from aiohttp import web

from agentrl.serving.controller.worker_client import Failed, Unreachable, WorkerClient


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 10.0))


async def raw_server(answer: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
                     ) -> tuple[asyncio.Server, str]:
    """A TCP server whose every connection is handled by `answer` (reads the request itself)."""
    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    return await reader.readexactly(length)


def test_keep_alive_reuse_and_limit() -> None:
    async def main() -> None:
        peers: set[Any] = set()
        in_flight, most = 0, 0

        async def echo(request: web.Request) -> web.Response:
            nonlocal in_flight, most
            peers.add(request.transport.get_extra_info("peername") if request.transport else None)
            in_flight += 1
            most = max(most, in_flight)
            await asyncio.sleep(0.01)
            in_flight -= 1
            return web.json_response({"got": (await request.read()).decode(), "q": request.query.get("x")})

        app = web.Application()
        app.add_routes([web.post("/echo", echo), web.get("/echo", echo)])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        address = f"http://127.0.0.1:{runner.addresses[0][1]}"
        client = WorkerClient(timeout_s=5.0, limit=2)
        for i in range(10):
            assert await client.request(address, "POST", "/echo", b'"%d"' % i) == (200, b'{"got": "\\"%d\\"", "q": null}' % i)
        assert len(peers) == 1  # one connection, kept alive
        status, body = await client.request(address, "GET", "/echo?x=1")
        assert (status, body) == (200, b'{"got": "", "q": "1"}')
        answers = await asyncio.gather(*(client.request(address, "POST", "/echo", b"1") for _ in range(12)))
        assert {a[0] for a in answers} == {200} and most == 2 and len(peers) == 2  # never more than the limit
        status, _ = await client.request(address, "POST", "/nowhere", b"{}")
        assert status == 404
        client.close()
        await runner.cleanup()
    run(main())


def garbage(payload: bytes, close: bool = True) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(payload)
        await writer.drain()
        if close:
            writer.close()
        else:
            await asyncio.sleep(5)
    return answer


@pytest.mark.parametrize(("payload", "says"), [
    (b"<html>hello</html>\r\n\r\n", "malformed status line"),
    (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{}", "without Content-Length"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", "Transfer-Encoding"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"cut\":", "closed"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n{}", "Content-Length"),
    (b"", "closed"),
])
def test_malformed_answers_fail(payload: bytes, says: str) -> None:
    async def main() -> None:
        server, address = await raw_server(garbage(payload))
        client = WorkerClient(timeout_s=2.0)
        with pytest.raises(Failed) as e:
            await client.request(address, "POST", "/interact", b"{}")
        assert says in str(e.value)
        client.close()
        server.close()
    run(main())


def test_timeout_and_unreachable() -> None:
    async def main() -> None:
        async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await asyncio.sleep(10)

        server, address = await raw_server(hang)
        client = WorkerClient(timeout_s=0.2)
        with pytest.raises(Failed) as e:
            await client.request(address, "POST", "/interact", b"{}")
        assert "timed out" in str(e.value)
        server.close()
        await server.wait_closed()
        with pytest.raises(Unreachable):
            await client.request(address, "POST", "/interact", b"{}")  # nobody listens there now
        with pytest.raises(Unreachable):
            await client.request("ftp://127.0.0.1:1", "GET", "/")
        client.close()
    run(main())


def test_a_pooled_connection_closed_by_the_worker_is_retried_once_on_a_fresh_one() -> None:
    async def main() -> None:
        served = 0

        async def once_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal served
            await read_request(reader)
            served += 1
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")  # says keep-alive (1.1) ...
            await writer.drain()
            await reader.read(1)  # ... then closes when the next request arrives, without answering it
            writer.close()

        server, address = await raw_server(once_then_close)
        client = WorkerClient(timeout_s=2.0)
        assert await client.request(address, "POST", "/x", b"{}") == (200, b"{}")
        assert await client.request(address, "POST", "/x", b"{}") == (200, b"{}")
        assert served == 2
        client.close()
        server.close()
    run(main())


def test_connection_close_answers_are_not_pooled() -> None:
    async def main() -> None:
        connections = 0

        async def close_each(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()
            writer.close()

        server, address = await raw_server(close_each)
        client = WorkerClient(timeout_s=2.0)
        for _ in range(3):
            assert await client.request(address, "POST", "/x", b"{}") == (200, b"{}")
        assert connections == 3
        client.close()
        server.close()
    run(main())
