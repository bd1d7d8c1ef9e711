"""One network flood against host:port, run as its own process by `flood.py` (standard library only, run
by its path, so that it starts in a blink and none of its sockets or CPU are the servers').

    python agentrl/checks/attacks/flooder.py MODE HOST PORT [--connections N] [--seconds S] [--source ADDR]

Prints its tally as one JSON line: connections opened, closed by the server, connect failures, answers
read (wrong_secret), the most it held open at once, and the longest one connection stayed open. The
modes are listed in `flood.py`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
from dataclasses import dataclass
from typing import Any

MODES = ("half_head", "drip_head", "idle", "wrong_secret", "huge_head", "slow_body")


@dataclass
class _Tally:
    opened: int = 0
    closed_by_server: int = 0
    connect_failed: int = 0
    answers: int = 0
    held: int = 0
    max_held: int = 0
    longest_s: float = 0.0
    """The longest any connection stayed open (until the server closed it, or until the flood ended)."""

    def up(self) -> float:
        self.opened += 1
        self.held += 1
        self.max_held = max(self.max_held, self.held)
        return time.monotonic()

    def down(self, since: float) -> None:
        self.held -= 1
        self.longest_s = round(max(self.longest_s, time.monotonic() - since), 3)


async def _wait_closed(reader: asyncio.StreamReader, drip: asyncio.StreamWriter | None, chunk: bytes,
                       deadline: float) -> bool:
    """Until the server closes the connection (True) or the deadline passes (False); `drip` sends `chunk`
    every 0.5 s meanwhile."""
    while time.monotonic() < deadline:
        try:
            data = await asyncio.wait_for(reader.read(65536), min(0.5, max(0.01, deadline - time.monotonic())))
        except TimeoutError:
            if drip is not None:
                try:
                    drip.write(chunk)
                except (ConnectionError, RuntimeError):
                    return True
            continue
        except (ConnectionError, OSError):
            return True
        if not data:
            return True
    return False


async def _connect(host: str, port: int, source: str, tally: _Tally
                   ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, float] | None:
    """A new connection from `source` (counted), or None after a short pause when none could be made."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, local_addr=(source, 0)), 2.0)
    except (OSError, TimeoutError):
        tally.connect_failed += 1
        await asyncio.sleep(0.05)
        return None
    return reader, writer, tally.up()


async def _holder(mode: str, host: str, port: int, source: str, deadline: float, tally: _Tally) -> None:
    head = f"POST /interact HTTP/1.1\r\nHost: {host}\r\n".encode()
    while time.monotonic() < deadline:
        opened = await _connect(host, port, source, tally)
        if opened is None:
            continue
        reader, writer, since = opened
        try:
            if mode in ("half_head", "drip_head"):
                writer.write(head)
            elif mode == "huge_head":
                writer.write(head + b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 8000) for i in range(64)))
            elif mode == "slow_body":
                writer.write(head + b"Content-Type: application/json\r\nContent-Length: 10000000\r\n\r\n{")
            closed = await _wait_closed(reader, writer if mode in ("drip_head", "slow_body") else None,
                                        b"a" if mode == "drip_head" else b" ", deadline)
        finally:
            tally.down(since)
            writer.transport.abort()
        if closed:
            tally.closed_by_server += 1


async def _asker(host: str, port: int, source: str, deadline: float, tally: _Tally) -> None:
    request = (f"POST /interact HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {'0' * 64}\r\n"
               "Connection: keep-alive\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}").encode()
    while time.monotonic() < deadline:
        opened = await _connect(host, port, source, tally)
        if opened is None:
            continue
        reader, writer, since = opened
        try:
            while time.monotonic() < deadline:  # as many requests as the server takes on one connection
                writer.write(request)
                data = await asyncio.wait_for(reader.read(65536), 2.0)
                if not data:
                    tally.closed_by_server += 1
                    break
                tally.answers += 1
        except (OSError, TimeoutError):
            tally.closed_by_server += 1
        finally:
            tally.down(since)
            writer.transport.abort()


async def flood(mode: str, host: str, port: int, connections: int, seconds: float, source: str) -> dict[str, Any]:
    tally = _Tally()
    deadline = time.monotonic() + seconds
    if mode == "wrong_secret":
        jobs = [_asker(host, port, source, deadline, tally) for _ in range(min(connections, 64))]
    else:
        jobs = [_holder(mode, host, port, source, deadline, tally) for _ in range(connections)]
    await asyncio.gather(*jobs)
    return {"mode": mode, **tally.__dict__}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="one flood against host:port; prints its tally as JSON")
    ap.add_argument("mode", choices=MODES)
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("--connections", type=int, default=1100)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--source", default="127.0.0.1", help="the local address to connect from (a peer)")
    args = ap.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    n = min(args.connections, max(16, hard - 64))
    print(json.dumps(asyncio.run(flood(args.mode, args.host, args.port, n, args.seconds, args.source))), flush=True)


if __name__ == "__main__":
    main()
