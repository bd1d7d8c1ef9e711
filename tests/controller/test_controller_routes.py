"""Controller and workers over real sockets on 127.0.0.1, all in this process (one event loop per test)."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any

import aiohttp
import pytest
from aio_helpers import run, wait_until

from agentrl.config import ControllerConfig, EnvsConfig
from agentrl.serving.client import EnvClient
from agentrl.serving.controller.server import RunningController, start_controller
from agentrl.serving.worker import RunningWorker, start_worker
from agentrl.tasks.api import EnvError
from agentrl.types import Status

FAST = ControllerConfig(heartbeat_s=0.05, dead_after_s=0.4, session_idle_s=30.0, request_timeout_s=5.0)


async def add_worker(ctrl: RunningController, worker_id: str, slots: int = 8,
                     cfg: ControllerConfig = FAST) -> RunningWorker:
    worker = await start_worker(EnvsConfig(tasks=("lookup",), slots=slots, expert_route="enabled"), cfg, ctrl.url, worker_id)
    reg = ctrl.controller.registry
    await wait_until(lambda: worker_id in reg.workers and reg.workers[worker_id].alive)
    return worker


async def crash(worker: RunningWorker) -> None:
    """Like kill -9: no more heartbeats, socket closed, no goodbye."""
    await worker.stop_heartbeats()
    await worker.http.close()
    await worker.runner.cleanup()


async def expert_episode(env: EnvClient, index: str) -> tuple[float, Status]:
    start = await env.start_sample("lookup", index)
    while True:
        result = await env.interact(start.session_id, await env.expert(start.session_id))
        if result.done:
            return result.reward, result.status


async def error_code(awaitable: Awaitable[Any]) -> str:
    with pytest.raises(EnvError) as e:
        await awaitable
    return e.value.code


def test_episodes_through_the_controller() -> None:
    async def main() -> None:
        ctrl = await start_controller(FAST)
        worker = await add_worker(ctrl, "w0", slots=32)
        async with EnvClient(ctrl.url) as env:
            start = await env.start_sample("lookup", "test-3")
            assert [m["role"] for m in start.messages] == ["system", "user"]
            assert [t["function"]["name"] for t in start.tools] == ["lookup", "submit_answer"]
            assert (await env.status())["sessions"] == {"lookup": 1}
            await env.cancel(start.session_id)
            results = await asyncio.gather(*(expert_episode(env, f"train-{i}") for i in range(20)))
            assert results == [(1.0, Status.COMPLETED)] * 20
            assert len(await env.indices("lookup", "train")) == 2000
            assert (await env.indices("lookup", "test"))[:2] == ["test-0", "test-1"]
            status = await env.status()
            assert status["sessions"] == {} and status["workers"][0]["worker_id"] == "w0"
            assert status["workers"][0]["alive"] and status["latency_ms"]["count"] >= 60
            assert 0 < status["latency_ms"]["p50"] <= status["latency_ms"]["p99"]
            assert worker.worker.sessions == {}  # ended episodes freed their slots on the worker
        await worker.stop()
        await ctrl.stop()
    run(main())


def test_errors_are_per_request() -> None:
    async def main() -> None:
        ctrl = await start_controller(FAST)
        worker = await add_worker(ctrl, "w0")
        async with EnvClient(ctrl.url) as env:
            start = await env.start_sample("lookup", "train-0")
            assert await error_code(env.interact("nope", {"role": "assistant", "content": ""})) == "unknown_session"
            assert await error_code(env.cancel("nope")) == "unknown_session"
            assert await error_code(env.expert("nope")) == "unknown_session"
            assert await error_code(env.start_sample("lokup", "train-0")) == "unknown_task"
            assert await error_code(env.start_sample("lookup", "train-99999")) == "bad_request"
            assert await error_code(env.indices("lookup", "dev")) == "bad_request"
            assert await error_code(env.interact(start.session_id, "not a message")) == "bad_request"  # type: ignore[arg-type]
            async with aiohttp.ClientSession() as http:
                async with http.post(f"{ctrl.url}/start_sample", data=b"{not json") as resp:
                    assert resp.status == 400 and (await resp.json())["error"]["code"] == "bad_request"
                async with http.post(f"{ctrl.url}/interact", json={"session_id": "nope", "message": {}}) as resp:
                    assert resp.status == 404
            # a malformed tool call is the model's mistake: an observation, not an error
            bad = {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "lookup", "arguments": "{"}}]}
            r = await env.interact(start.session_id, bad)
            assert not r.done and r.messages[0]["content"].startswith("Error: arguments are not valid JSON")
            # and after all that the session and the controller still work
            await env.cancel(start.session_id)
            assert await error_code(env.interact(start.session_id, bad)) == "unknown_session"
            assert await expert_episode(env, "train-1") == (1.0, Status.COMPLETED)
        await worker.stop()
        await ctrl.stop()
    run(main())


def test_killed_worker_sessions_end_as_env_error() -> None:
    async def main() -> None:
        ctrl = await start_controller(FAST)
        w0 = await add_worker(ctrl, "w0", slots=8)
        w1 = await add_worker(ctrl, "w1", slots=4)
        async with EnvClient(ctrl.url) as env:
            a = await env.start_sample("lookup", "train-0")  # w0 has the most free slots
            b = await env.start_sample("lookup", "train-1")
            assert ctrl.controller.registry.sessions[a.session_id].worker_id == "w0"
            await crash(w0)
            # the next call finds the socket closed: the session ends as env_error
            r = await env.interact(a.session_id, {"role": "assistant", "content": ""})
            assert (r.done, r.status, r.reward) == (True, Status.ENV_ERROR, 0.0) and r.error
            # the other session of the dead worker ends too, and says so on every later call
            r = await env.interact(b.session_id, {"role": "assistant", "content": ""})
            assert (r.done, r.status) == (True, Status.ENV_ERROR)
            assert await error_code(env.expert(b.session_id)) == "env_error"
            await env.cancel(b.session_id)  # cancelling an ended session is fine
            status = await env.status()
            assert [w["alive"] for w in status["workers"]] == [False, True]
            assert status["errors"] >= 2
            # new sessions go to the surviving worker
            assert await expert_episode(env, "test-0") == (1.0, Status.COMPLETED)
            assert len(w1.worker.sessions) == 0
        await w1.stop()
        await ctrl.stop()
    run(main())


def test_silent_worker_is_declared_dead_after_missed_heartbeats() -> None:
    async def main() -> None:
        ctrl = await start_controller(FAST)
        w0 = await add_worker(ctrl, "w0")
        async with EnvClient(ctrl.url) as env:
            a = await env.start_sample("lookup", "train-0")
            await w0.stop_heartbeats()  # hung: socket open, no heartbeats
            reg = ctrl.controller.registry
            await wait_until(lambda: not reg.workers["w0"].alive)
            r = await env.interact(a.session_id, {"role": "assistant", "content": ""})
            assert (r.done, r.status) == (True, Status.ENV_ERROR) and "heartbeat" in (r.error or "")
            assert await error_code(env.start_sample("lookup", "train-0")) == "no_capacity"
            # it comes back: the controller tells it to re-register, and the dead session is dropped
            w0.start_heartbeats()
            await wait_until(lambda: reg.workers["w0"].alive)
            await wait_until(lambda: a.session_id not in w0.worker.sessions)
            assert await expert_episode(env, "train-2") == (1.0, Status.COMPLETED)
        await w0.stop()
        await ctrl.stop()
    run(main())


def test_routing_late_joiner_and_capacity() -> None:
    async def main() -> None:
        ctrl = await start_controller(FAST)
        reg = ctrl.controller.registry
        w0 = await add_worker(ctrl, "w0", slots=2)
        async with EnvClient(ctrl.url) as env:
            s = [await env.start_sample("lookup", f"train-{i}") for i in range(2)]
            assert await error_code(env.start_sample("lookup", "train-2")) == "no_capacity"
            await env.cancel(s[0].session_id)
            s[0] = await env.start_sample("lookup", "train-2")  # the freed slot is usable again
            w1 = await add_worker(ctrl, "w1", slots=3)  # joins later and gets the traffic
            owners = [reg.sessions[(await env.start_sample("lookup", f"train-{i}")).session_id].worker_id
                      for i in range(3)]
            assert owners == ["w1", "w1", "w1"]
            assert await error_code(env.start_sample("lookup", "train-9")) == "no_capacity"
            status = await env.status()
            assert [(w["worker_id"], w["active"], w["slots"]) for w in status["workers"]] == [("w0", 2, 2), ("w1", 3, 3)]
            assert status["sessions"] == {"lookup": 5}
            # a draining worker gets no new sessions once its heartbeat says so
            await env.cancel(s[1].session_id)
            async with aiohttp.ClientSession() as http, http.post(f"{w0.address}/drain") as resp:
                assert resp.status == 200
            await wait_until(lambda: reg.workers["w0"].draining)
            assert await error_code(env.start_sample("lookup", "train-9")) == "no_capacity"
        await w0.stop()
        await w1.stop()
        await ctrl.stop()
    run(main())


def test_most_free_slots_wins() -> None:
    async def main() -> None:
        ctrl = await start_controller(FAST)
        reg = ctrl.controller.registry
        workers = [await add_worker(ctrl, "w0", slots=4), await add_worker(ctrl, "w1", slots=8)]
        async with EnvClient(ctrl.url) as env:
            starts = await asyncio.gather(*(env.start_sample("lookup", f"train-{i}") for i in range(12)))
            owners = [reg.sessions[s.session_id].worker_id for s in starts]
            assert owners.count("w0") == 4 and owners.count("w1") == 8
            assert {w.worker.worker_id: len(w.worker.sessions) for w in workers} == {"w0": 4, "w1": 8}
        for w in workers:
            await w.stop()
        await ctrl.stop()
    run(main())


def test_a_stalled_controller_counts_the_stall_against_no_worker_or_session() -> None:
    """The controller's loop blocked longer than dead_after_s and session_idle_s (a loaded node, a GC pause): the
    heartbeats and calls that waited unread meanwhile are not silence, so the worker stays alive and its session
    open. (CI caught a worker declared dead this way: 12 sessions started at once on a loaded 2-core machine.)"""
    async def main() -> None:
        cfg = ControllerConfig(heartbeat_s=0.05, dead_after_s=0.4, session_idle_s=1.5, request_timeout_s=5.0)
        ctrl = await start_controller(cfg)
        w0 = await add_worker(ctrl, "w0", cfg=cfg)
        reg = ctrl.controller.registry
        async with EnvClient(ctrl.url) as env:
            a = await env.start_sample("lookup", "train-0")
            time.sleep(2.0)  # blocks the one loop: controller, worker and client alike
            for _ in range(10):  # half a second of sweeps once it runs again
                await asyncio.sleep(0.05)
                assert reg.workers["w0"].alive and a.session_id in reg.sessions
            assert (await env.expert(a.session_id))["role"] == "assistant"  # the session still works
            assert reg.ended_by == {} and (await env.status())["workers"][0]["alive"]
            # the worker's own silence is still seen: stop its heartbeats and it dies on time
            await w0.stop_heartbeats()
            await wait_until(lambda: not reg.workers["w0"].alive)
        await w0.stop()
        await ctrl.stop()
    run(main())


def test_idle_sessions_expire_on_controller_and_worker() -> None:
    async def main() -> None:
        cfg = ControllerConfig(heartbeat_s=0.05, dead_after_s=0.4, session_idle_s=0.3, request_timeout_s=5.0)
        ctrl = await start_controller(cfg)
        w0 = await add_worker(ctrl, "w0", cfg=cfg)
        async with EnvClient(ctrl.url) as env:
            a = await env.start_sample("lookup", "train-0")
            await wait_until(lambda: a.session_id not in w0.worker.sessions)
            r = await env.interact(a.session_id, {"role": "assistant", "content": ""})
            assert (r.done, r.status) == (True, Status.ENV_ERROR) and "idle" in (r.error or "")
        await w0.stop()
        await ctrl.stop()
    run(main())


def test_client_connection_failure_is_env_error() -> None:
    async def main() -> None:
        async with EnvClient("http://127.0.0.1:9", timeout_s=2.0) as env:
            assert await error_code(env.status()) == "env_error"
    run(main())


def test_indices_wait_for_the_first_worker() -> None:
    """Roles started together (a requeued Slurm job): asked before any worker registered, the controller says
    no_capacity; `indices` waits for a worker instead of failing, up to its bound."""
    async def main() -> None:
        ctrl = await start_controller(FAST)
        async with EnvClient(ctrl.url) as env:
            assert await error_code(env.indices("lookup", "train", wait_s=0.2, poll_s=0.05)) == "no_capacity"
            asked = asyncio.create_task(env.indices("lookup", "train", wait_s=30.0, poll_s=0.05))
            await asyncio.sleep(0.3)
            assert not asked.done()
            worker = await add_worker(ctrl, "w0")
            assert len(await asyncio.wait_for(asked, 10.0)) > 0
            assert await error_code(env.indices("lokup", "train")) == "unknown_task"  # not waited for
        await worker.stop()
        await ctrl.stop()

    run(main())
