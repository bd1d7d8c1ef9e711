"""Network floods against a running controller and env worker: what anyone on the partition can do to our
ports without the run's secret, while the run's own client plays episodes through them.

Each flood runs in child processes (`flooder.py`, one per server, so their sockets and CPU are not the
servers'), for a bounded time, from a bounded number of connections, and stops by itself. A connection the
server closes is opened again at once, so the pressure lasts.

    half_head     N connections, each sends the start of a request head and nothing more
    drip_head     N connections that send one more byte of their head every 0.5 s (slowloris)
    idle          N connections that send nothing at all
    wrong_secret  64 loops of whole requests with a wrong secret, back to back (each answer is 401)
    huge_head     N connections, each sends a head of 64 header lines of 8 KB (512 KB) at once
    slow_body     N requests without the secret that announce 10 MB of body and trickle it

A flood *holds* when, while it ran, every call of the run's own client (start_sample, expert, interact,
cancel) succeeded, within `MAX_CALL_S` on a kept-alive connection and `MAX_NEW_CALL_S` on a new one, the
worker was never declared dead, neither server held a connection that had not shown the secret for longer
than its head deadline plus `SLACK_S`, and afterwards neither held any such connection.

The servers are the caller's (`jobs/attack_check.py` starts a controller and a worker process serving
`lookup` with the expert route on); this module only talks to them over HTTP.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from agentrl.checks.attacks.flooder import MODES
from agentrl.checks.attacks.runner import AttackResult
from agentrl.serving.client import EnvClient

MAX_CALL_S = 3.0
"""The slowest call of the run's own client on a kept-alive connection a flood may cause (an unloaded call
takes a few ms; on 5d8debb a 512 KB-head flood took them past 13 s)."""
MAX_NEW_CALL_S = 8.0
"""The same on a new connection, which waits in the kernel's accept queue behind the flood's."""
SLACK_S = 1.5
"""How late past its head deadline a server may close a flood's connection (a loaded event loop)."""
FLOODER = Path(__file__).with_name("flooder.py")


def start_flood(mode: str, url: str, connections: int, seconds: float, source: str = "127.0.0.1"
                ) -> subprocess.Popen[str]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return subprocess.Popen([sys.executable, str(FLOODER), mode, host, port, "--connections", str(connections),
                             "--seconds", str(seconds), "--source", source], stdout=subprocess.PIPE, text=True)


def _tally(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=120)
    lines = [line for line in (out or "").splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"opened": 0, "closed_by_server": 0, "max_held": 0}


async def _episode(env: EnvClient, times: list[float], errors: list[str]) -> None:
    """One lookup episode through the controller (the expert's moves), each call timed."""
    async def timed(coro: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await coro
        except Exception as e:  # noqa: BLE001 - every failure of the run's own client is the finding
            errors.append(f"{type(e).__name__}: {str(e)[:160]}")
            return None
        finally:
            times.append(time.perf_counter() - t0)

    start = await timed(env.start_sample("lookup", "train-0"))
    if start is None:
        return
    for _ in range(4):
        message = await timed(env.expert(start.session_id))
        if message is None:
            return
        result = await timed(env.interact(start.session_id, message))
        if result is None or result.done:
            return
    await timed(env.cancel(start.session_id))


async def _run_traffic(url: str, secret: str, until: asyncio.Event, latencies: dict[str, list[float]],
                       errors: list[str]) -> None:
    """Episodes back to back on a client that keeps its connections (`kept`: the rollout's pool; the workers'
    heartbeats and the controller's calls to its workers keep theirs too), and on one that opens a new
    connection for every call (`fresh`: a pool growing, a restarted rank)."""
    async def loop(env: EnvClient, times: list[float]) -> None:
        try:
            while not until.is_set():
                await _episode(env, times, errors)
                await asyncio.sleep(0.05)
        finally:
            await env.close()

    kept = EnvClient(url, secret=secret, timeout_s=10.0, keepalive_s=None)
    fresh = _NewConnections(url, secret=secret, timeout_s=10.0, keepalive_s=None)
    await asyncio.gather(loop(kept, latencies["kept"]), loop(fresh, latencies["fresh"]))


class _NewConnections(EnvClient):
    """An env client that opens a new connection for every call."""

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True), headers=self.headers,
                                               timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        return self._http


async def _status(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(f"{url}/status") as resp:
        return dict(await resp.json())


async def play_flood(mode: str, controller_url: str, secret: str, head_timeout_s: float, connections: int = 1100,
                     seconds: float = 5.0, source: str = "127.0.0.1") -> AttackResult:
    """One flood at the controller and its (first) worker at once, judged as the module docstring says."""
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {secret}"},
                                     timeout=aiohttp.ClientTimeout(total=30)) as http:
        before = await _status(http, controller_url)
        worker_id, worker_url = before["workers"][0]["worker_id"], before["workers"][0]["address"]
        died_before = before["errors_by_class"].get("worker_died", 0)
        procs = [start_flood(mode, url, connections, seconds, source) for url in (controller_url, worker_url)]
        latencies: dict[str, list[float]] = {"kept": [], "fresh": []}
        errors: list[str] = []
        until = asyncio.Event()
        traffic = asyncio.create_task(_run_traffic(controller_url, secret, until, latencies, errors))
        dead_seen, oldest, t_end = False, 0.0, time.monotonic() + seconds
        while time.monotonic() < t_end:  # what the servers say while the flood runs, on a kept connection
            ctrl, work = await asyncio.gather(_status(http, controller_url), _status(http, worker_url))
            w = next((w for w in ctrl["workers"] if w["worker_id"] == worker_id), None)
            dead_seen = dead_seen or w is None or not w["alive"]
            oldest = max(oldest, ctrl["connections"]["oldest_pending_s"], work["connections"]["oldest_pending_s"])
            await asyncio.sleep(0.2)
        tallies = await asyncio.gather(*(asyncio.to_thread(_tally, p) for p in procs))
        until.set()
        await traffic
        drain_until, left = time.monotonic() + head_timeout_s + SLACK_S, 0
        while True:  # what the flood left behind
            ctrl, work = await asyncio.gather(_status(http, controller_url), _status(http, worker_url))
            left = ctrl["connections"]["pending"] + work["connections"]["pending"]
            if not left or time.monotonic() > drain_until:
                break
            await asyncio.sleep(0.1)
    slowest = {kind: max(times, default=0.0) for kind, times in latencies.items()}
    why = []
    if errors:
        why.append(f"{len(errors)} of the run's calls failed (first: {errors[0]})")
    if slowest["kept"] > MAX_CALL_S:
        why.append(f"the run's slowest call on a kept connection took {slowest['kept']:.1f} s")
    if slowest["fresh"] > MAX_NEW_CALL_S:
        why.append(f"the run's slowest call on a new connection took {slowest['fresh']:.1f} s")
    if not all(latencies.values()):
        why.append("the run's client made no call")
    if dead_seen or ctrl["errors_by_class"].get("worker_died", 0) > died_before:
        why.append("the worker was declared dead")
    if oldest > head_timeout_s + SLACK_S:
        why.append(f"a connection without the secret stayed {oldest:.1f} s (head deadline {head_timeout_s:g} s)")
    if left:
        why.append(f"{left} connections without the secret still open {head_timeout_s + SLACK_S:g} s after")
    detail = (f"{sum(map(len, latencies.values()))} calls, slowest {slowest['kept'] * 1000:.0f} ms kept-alive, "
              f"{slowest['fresh'] * 1000:.0f} ms new; flood opened {sum(t['opened'] for t in tallies)}, held at "
              f"most {sum(t['max_held'] for t in tallies)}, closed by the servers "
              f"{sum(t['closed_by_server'] for t in tallies)}; oldest pending {oldest:.1f} s; "
              f"controller {ctrl['connections']}, worker {work['connections']}")
    return AttackResult(f"flood_{mode}", "http", "-", 0.0, "completed" if not why else "hurt", not why,
                        "; ".join(why) or detail)


def play_floods(controller_url: str, secret: str, head_timeout_s: float, modes: list[str] | None = None,
                connections: int = 1100, seconds: float = 5.0, source: str = "127.0.0.1") -> list[AttackResult]:
    """Each flood of `modes` (default all) in turn against the controller at `controller_url` and its worker."""
    async def main() -> list[AttackResult]:
        await _worker_registered(controller_url, secret)
        return [await play_flood(m, controller_url, secret, head_timeout_s, connections, seconds, source)
                for m in modes or MODES]
    return asyncio.run(main())


async def _worker_registered(controller_url: str, secret: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {secret}"}) as http:
        while True:
            try:
                if any(w["alive"] for w in (await _status(http, controller_url))["workers"]):
                    return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"no worker registered with {controller_url} in {timeout_s:g} s")
            await asyncio.sleep(0.2)
