"""Faults that must cost only the session that causes them, against real processes on 127.0.0.1:
a controller (`jobs.controller`) and a worker serving test tasks (`fault_worker.py`), with the run's secret.

Timing margins are generous (a 2-core machine under load): the tests bound how long they wait, never
how fast something is.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from agentrl.auth import run_secret
from agentrl.config import config_from_dict, dump_config
from agentrl.launch import rendezvous
from agentrl.serving.client import EnvClient
from agentrl.tasks.api import EnvError
from agentrl.types import Status

REPO = Path(__file__).resolve().parents[2]
CONTROLLER = {"heartbeat_s": 0.2, "dead_after_s": 3.0, "request_timeout_s": 6.0, "body_timeout_s": 1.0}
CALL_TIMEOUT_S = 4.8  # the worker's deadline for one task call: 0.8 * request_timeout_s
SLOTS = 40


@dataclass
class Stack:
    run_dir: Path
    url: str
    worker_url: str
    secret: str

    def client(self, url: str | None = None, **kw: Any) -> EnvClient:
        return EnvClient(url or self.url, secret=self.secret, keepalive_s=None, **kw)


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("AGENTRL_SECRET", None)
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    run_dir = tmp_path_factory.mktemp("faults")
    dump_config(config_from_dict({"controller": CONTROLLER}), run_dir / "config.yaml")
    procs = [_spawn(["-m", "jobs.controller", "--run-dir", str(run_dir)], run_dir / "controller.log")]
    try:
        url = rendezvous.wait_for(run_dir, "controller_url", timeout_s=60.0)
        procs.append(_spawn([str(REPO / "tests/envs/fault_worker.py"), str(run_dir), "w0", str(SLOTS)],
                            run_dir / "worker.log"))
        s = Stack(run_dir, url, "", run_secret(run_dir))

        async def wait_worker() -> str:
            async with s.client() as env:
                deadline = time.monotonic() + 60.0
                while True:
                    workers = [w for w in (await env.status())["workers"] if w["alive"]]
                    if workers:
                        return str(workers[0]["address"])
                    assert time.monotonic() < deadline, (run_dir / "worker.log").read_text()
                    await asyncio.sleep(0.1)

        s.worker_url = asyncio.run(wait_worker())
        yield s
    finally:
        for p in procs:
            p.kill()
            p.wait()


def nap(seconds: float, end: bool = False) -> dict[str, Any]:
    args = json.dumps({"seconds": seconds, "end": end})
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "nap", "arguments": args}}]}


def nonzero(counts: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in counts.items() if v}


def delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, int]:
    keys = set(after["errors_by_class"]) | set(before["errors_by_class"])
    return nonzero({k: after["errors_by_class"].get(k, 0) - before["errors_by_class"].get(k, 0) for k in keys})


async def watch_heartbeats(env: EnvClient, stop: asyncio.Event) -> float:
    """The oldest heartbeat age /status showed while `stop` was unset."""
    oldest = 0.0
    while not stop.is_set():
        for w in (await env.status())["workers"]:
            assert w["alive"], w
            oldest = max(oldest, w["heartbeat_age_s"])
        await asyncio.sleep(0.2)
    return oldest


def test_thirty_slow_calls_at_once_all_finish(stack: Stack) -> None:
    """30 sessions each in a 2 s task call: a thread per slot, so none waits for another's thread
    (asyncio's default pool has 6 threads here: 5 rounds of 2 s would pass the 4.8 s call deadline)."""
    async def main() -> None:
        async with stack.client(timeout_s=60.0) as env:
            before = await env.status()
            starts = [await env.start_sample("nap", f"train-{i}") for i in range(30)]
            stop = asyncio.Event()
            watcher = asyncio.create_task(watch_heartbeats(env, stop))
            results = await asyncio.gather(*(env.interact(s.session_id, nap(2.0, end=True)) for s in starts))
            stop.set()
            oldest = await watcher
            assert [(r.done, r.status, r.reward) for r in results] == [(True, Status.COMPLETED, 1.0)] * 30
            assert oldest < CONTROLLER["dead_after_s"], oldest  # heartbeats kept coming during the calls
            after = await env.status()
            assert delta(after, before) == {} and after["workers"][0]["failures"] == 0
    asyncio.run(main())


def test_hung_call_ends_only_its_session(stack: Stack) -> None:
    """A call that never returns: its session ends env_error with a clear reason; the worker lives,
    others are served meanwhile, its thread is counted as taken, and the failure is counted once."""
    async def main() -> None:
        async with stack.client(timeout_s=60.0) as env, stack.client(stack.worker_url) as direct:
            before, worker_before = await env.status(), await direct.status()
            hung = await env.start_sample("nap", "train-50")
            others = [await env.start_sample("nap", f"train-{60 + i}") for i in range(3)]
            pending = asyncio.create_task(env.interact(hung.session_id, nap(600.0)))
            for _ in range(3):  # everyone else is served while the hung call waits
                for s in others:
                    r = await env.interact(s.session_id, nap(0.05))
                    assert (r.done, r.status) == (False, Status.RUNNING)
            r = await asyncio.wait_for(pending, 30.0)
            assert (r.done, r.status, r.reward) == (True, Status.ENV_ERROR, 0.0)
            assert f"took longer than {CALL_TIMEOUT_S:g}s" in (r.error or ""), r.error
            again = await env.interact(hung.session_id, nap(0.0))  # ended: says so on every later call
            assert (again.done, again.status) == (True, Status.ENV_ERROR) and "took longer" in (again.error or "")
            worker = (await env.status())["workers"][0]
            assert worker["alive"] and worker["failures"] == 0
            load = await direct.status()
            assert load["stuck"] == worker_before["stuck"] + 1  # its thread still sleeps, holding a slot
            assert load["free"] == SLOTS - load["active"] - load["stuck"]
            assert load["call_timeouts"] == worker_before["call_timeouts"] + 1
            for s in others:
                r = await env.interact(s.session_id, nap(0.0, end=True))
                assert (r.done, r.status) == (True, Status.COMPLETED)
            assert delta(await env.status(), before) == {"env_error": 1}
    asyncio.run(main())


def test_a_cpu_bound_call_of_a_non_blocking_task_keeps_the_worker_alive(stack: Stack) -> None:
    """On c07c523 a task without `blocking` ran on the worker's event loop, so one CPU-bound
    call (kg's exponential programs) stopped the heartbeats and the controller declared the worker dead.
    Every task call now runs on the pool: heartbeats go on, and a call past its deadline ends its session."""
    async def main() -> None:
        async with stack.client(timeout_s=60.0) as env:
            short, long = await env.start_sample("spin", "train-0"), await env.start_sample("spin", "train-1")
            stop = asyncio.Event()
            watcher = asyncio.create_task(watch_heartbeats(env, stop))
            r = await env.interact(short.session_id, nap(4.0))  # longer than dead_after_s (3 s)
            assert (r.done, r.status, r.reward) == (True, Status.COMPLETED, 1.0)
            r = await env.interact(long.session_id, nap(8.0))  # past the call's deadline: only this session ends
            assert (r.done, r.status) == (True, Status.ENV_ERROR) and "took longer" in (r.error or "")
            stop.set()
            assert await watcher < 2.5
            ok = await env.start_sample("lookup", "train-0")
            assert ok.session_id
            await env.cancel(ok.session_id)
    asyncio.run(main())


def test_racing_interacts_on_one_session_are_busy(stack: Stack) -> None:
    """20 interacts at once on one session, through the controller and straight to the worker: one
    runs, 19 get 409 busy, and the session carries on (it is never "lost")."""
    async def race(env: EnvClient, sid: str) -> tuple[list[str], list[str]]:
        outcomes = await asyncio.gather(*(env.interact(sid, nap(3.0)) for _ in range(20)), return_exceptions=True)
        ran = [r.messages[-1]["content"] for r in outcomes if not isinstance(r, BaseException)]
        refused = [r.code for r in outcomes if isinstance(r, EnvError)]
        assert len(ran) + len(refused) == 20, outcomes
        return ran, refused

    async def main() -> None:
        async with stack.client(timeout_s=60.0) as env, stack.client(stack.worker_url, timeout_s=60.0) as direct:
            before = await env.status()
            start = await env.start_sample("nap", "train-70")
            ran, refused = await race(env, start.session_id)
            assert ran == ["slept; most calls at once: 1"] and refused == ["busy"] * 19
            ran, refused = await race(direct, start.session_id)  # the worker serializes on its own too
            assert ran == ["slept; most calls at once: 1"] and refused == ["busy"] * 19
            r = await env.interact(start.session_id, nap(0.0, end=True))
            assert (r.done, r.status, r.reward) == (True, Status.COMPLETED, 1.0)
            after = await env.status()
            assert delta(after, before) == {} and after["busy"] - before["busy"] == 19
    asyncio.run(main())


def test_a_message_of_38000_tool_calls_is_one_cheap_error(stack: Stack) -> None:
    async def main() -> None:
        call = {"id": "c", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
        huge = {"role": "assistant", "content": "", "tool_calls": [call] * 38_000}
        assert 2_000_000 < len(json.dumps(huge)) < 4 * 1024 * 1024
        async with stack.client(timeout_s=60.0) as env:
            before = await env.status()
            starts = [await env.start_sample("lookup", f"train-{i}") for i in range(4)]
            stop = asyncio.Event()
            watcher = asyncio.create_task(watch_heartbeats(env, stop))
            results = await asyncio.gather(*(env.interact(s.session_id, huge) for s in starts))
            stop.set()
            oldest = await watcher
            for r in results:
                assert (r.done, r.status) == (False, Status.RUNNING) and len(r.messages) == 1
                text = r.messages[0]["content"]
                assert text.startswith("Error: 38000 tool calls in one message; the limit is 16") and len(text) < 200
            assert oldest < CONTROLLER["dead_after_s"], oldest
            r = await env.interact(starts[0].session_id, {"role": "assistant", "content": "hmm"})
            assert r.messages[-1]["content"].startswith("Please call one of the tools")  # still serving
            assert delta(await env.status(), before) == {}
    asyncio.run(main())


def test_arguments_nested_4000_deep_are_an_observation(stack: Stack) -> None:
    """8 KB of arguments nested 4,000 deep answered 502 RecursionError on c07c523."""
    async def main() -> None:
        deep = '{"name": ' + "[" * 4000 + "]" * 4000 + ', "field": "x"}'
        message = {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "lookup", "arguments": deep}}]}
        async with stack.client(timeout_s=60.0) as env:
            before = await env.status()
            start = await env.start_sample("lookup", "train-0")
            r = await env.interact(start.session_id, message)
            assert (r.done, r.status) == (False, Status.RUNNING), r
            assert r.messages[0]["content"].startswith("Error: arguments are nested too deeply (4001 levels")
            await env.cancel(start.session_id)
            assert delta(await env.status(), before) == {}
    asyncio.run(main())


async def raw_request(url: str, head: str, body: bytes, close_after_send: bool = False,
                      wait_s: float = 20.0) -> tuple[int, bytes]:
    """One hand-made HTTP request; (status, body) of the answer, read by its Content-Length (the server
    may keep the socket a while longer to drain what the client announced: that costs us nothing)."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    writer.write(head.encode() + b"\r\n" + body)
    await writer.drain()
    if close_after_send:
        writer.close()
        await writer.wait_closed()
        return 0, b""
    try:
        async with asyncio.timeout(wait_s):
            head_lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            length = next(int(h.split(":")[1]) for h in head_lines if h.lower().startswith("content-length:"))
            answer = await reader.readexactly(length)
    finally:
        writer.close()
    return int(head_lines[0].split()[1]), answer


def headers(path: str, length: int, secret: str | None) -> str:
    auth = f"Authorization: Bearer {secret}\r\n" if secret else ""
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n"
            f"Content-Length: {length}\r\n")


@pytest.mark.parametrize("where", ["controller", "worker"])
def test_short_and_oversized_bodies_get_prompt_answers(stack: Stack, where: str) -> None:
    """10^8 bytes announced: 413 before reading; 1,000 announced and 7 sent: 408 after body_timeout_s."""
    url = stack.url if where == "controller" else stack.worker_url

    async def main() -> None:
        status, body = await raw_request(url, headers("/interact", 10**8, stack.secret), b'{"a": 1')
        assert status == 413 and json.loads(body)["error"]["code"] == "bad_request"
        status, body = await raw_request(url, headers("/interact", 1000, stack.secret), b'{"a": 1')
        assert status == 408 and "did not arrive within 1s" in json.loads(body)["error"]["message"]
        status, _ = await raw_request(url, headers("/interact", 10**8, None), b'{"a": 1')
        assert status == 401  # no secret: refused before anything is read
        async with stack.client(url) as env:  # and the server still serves
            assert (await env.status())["workers" if where == "controller" else "worker_id"]
    asyncio.run(main())


def test_client_hanging_up_is_not_an_error(stack: Stack) -> None:
    async def main() -> None:
        async with stack.client() as env:
            before = await env.status()
            await raw_request(stack.url, headers("/start_sample", 500, stack.secret), b'{"task": "na',
                              close_after_send=True)
            deadline = time.monotonic() + 20.0
            while (after := await env.status())["client_disconnects"] == before["client_disconnects"]:
                assert time.monotonic() < deadline, "the disconnect was never noticed"
                await asyncio.sleep(0.1)
            assert after["client_disconnects"] == before["client_disconnects"] + 1
            assert after["errors"] == before["errors"]
        log = (stack.run_dir / "controller.log").read_text()
        assert "Traceback" not in log and "ERROR" not in log, log[-2000:]
    asyncio.run(main())


def test_errors_never_echo_a_large_input(stack: Stack) -> None:
    async def main() -> None:
        async with stack.client() as env, stack.client(stack.worker_url) as direct:
            for client in (env, direct):
                with pytest.raises(EnvError) as e:
                    await client.start_sample("t" * 100_000, "train-0")
                assert e.value.code in ("unknown_task", "no_capacity") and len(e.value.message) < 500
                with pytest.raises(EnvError) as e:
                    await client.interact("s" * 100_000, nap(0.0))
                assert e.value.code == "unknown_session" and len(e.value.message) < 500
            start = await env.start_sample("nap", "train-80")
            r = await env.interact(start.session_id, {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "n" * 5000, "arguments": "{}"}}]})
            assert r.messages[0]["content"].startswith("Error: unknown tool 'nnn") and len(r.messages[0]["content"]) < 500
            await env.cancel(start.session_id)
    asyncio.run(main())
