"""Draining, keep-alive and expiry, and /status, over real sockets on 127.0.0.1 (one process)."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aio_helpers import run, wait_until

from agentrl.config import ControllerConfig, EnvsConfig
from agentrl.serving.client import EnvClient
from agentrl.serving.controller.server import RunningController, start_controller
from agentrl.serving.worker import RunningWorker, start_worker
from agentrl.tasks.api import EnvError
from agentrl.tasks.example import GuessTask
from agentrl.tasks.lookup import LookupTask
from agentrl.types import Status

FAST = ControllerConfig(heartbeat_s=0.05, dead_after_s=0.4, session_idle_s=30.0, keepalive_s=1.0)


async def add_worker(ctrl: RunningController, worker_id: str, slots: int, cfg: ControllerConfig = FAST,
                     tasks: dict[str, Any] | None = None) -> RunningWorker:
    tasks = tasks or {"lookup": LookupTask()}
    worker = await start_worker(EnvsConfig(tasks=tuple(tasks), slots=slots, expert_route="enabled"), cfg, ctrl.url, worker_id, tasks=tasks)
    reg = ctrl.controller.registry
    await wait_until(lambda: worker_id in reg.workers and reg.workers[worker_id].alive)
    return worker


async def finish(env: EnvClient, sid: str) -> tuple[float, Status]:
    while True:
        r = await env.interact(sid, await env.expert(sid))
        if r.done:
            return r.reward, r.status


def test_drained_worker_finishes_its_sessions_and_gets_no_new_ones() -> None:
    async def main() -> None:
        ctrl = await start_controller(FAST)
        reg = ctrl.controller.registry
        w0, w1 = await add_worker(ctrl, "w0", slots=8), await add_worker(ctrl, "w1", slots=4)
        async with EnvClient(ctrl.url) as env:
            held = [await env.start_sample("lookup", f"train-{i}") for i in range(2)]
            assert {reg.sessions[s.session_id].worker_id for s in held} == {"w0"}  # the most free slots
            answer = await env.drain("w0")
            assert answer == {"ok": True, "worker_id": "w0", "active": 2}
            assert w0.worker.draining  # told at once, so its heartbeats keep saying so
            new = [await env.start_sample("lookup", f"test-{i}") for i in range(4)]
            assert {reg.sessions[s.session_id].worker_id for s in new} == {"w1"}
            assert await finish(env, held[0].session_id) == (1.0, Status.COMPLETED)  # its own run to the end
            assert await finish(env, held[1].session_id) == (1.0, Status.COMPLETED)
            workers = {w["worker_id"]: w for w in (await env.status())["workers"]}
            assert workers["w0"]["draining"] and workers["w0"]["active"] == 0 and workers["w0"]["alive"]
            assert await w0.drain(timeout_s=1.0) == 0  # nothing left: a SIGTERM now loses nothing
            with pytest.raises(EnvError) as e:
                await env.start_sample("lookup", "test-9")  # w1 full, w0 draining
            assert e.value.code == "no_capacity"
            with pytest.raises(EnvError) as e:
                await env.drain("w9")
            assert e.value.code == "not_found"
        await w0.stop()
        await w1.stop()
        await ctrl.stop()
    run(main())


def test_keepalive_spares_sessions_waiting_on_a_slow_model() -> None:
    """Idle = nothing heard from the client. A client that keeps its sessions alive can think for 2.5x
    the idle limit; one that went silent loses its session; the worker frees only what the controller
    forgot, even for sessions quiet on the worker for longer than the limit."""
    async def main() -> None:
        cfg = ControllerConfig(heartbeat_s=0.05, dead_after_s=0.3, session_idle_s=1.0, keepalive_s=0.2)
        ctrl = await start_controller(cfg)
        w0 = await add_worker(ctrl, "w0", slots=8, cfg=cfg)
        async with EnvClient(ctrl.url, keepalive_s=cfg.keepalive_s) as alive, \
                EnvClient(ctrl.url, keepalive_s=None) as silent, \
                EnvClient(w0.address, keepalive_s=None) as direct:
            slow = await alive.start_sample("lookup", "train-0")
            gone = await silent.start_sample("lookup", "train-1")
            orphan = await direct.start_sample("lookup", "train-2")  # behind the controller's back
            assert alive.held == {slow.session_id}
            await asyncio.sleep(2.5 * cfg.session_idle_s)  # "generating", or a weight sync
            await wait_until(lambda: orphan.session_id not in w0.worker.sessions)
            assert slow.session_id in w0.worker.sessions  # quiet there too, but the controller holds it
            assert await finish(alive, slow.session_id) == (1.0, Status.COMPLETED)
            assert not alive.held
            r = await silent.interact(gone.session_id, {"role": "assistant", "content": ""})
            assert (r.done, r.status) == (True, Status.ENV_ERROR) and "idle" in (r.error or "")
            assert not w0.worker.sessions
        await w0.stop()
        await ctrl.stop()
    run(main())


def test_status_counts_sessions_per_task_and_times_the_controller() -> None:
    async def main() -> None:
        ctrl = await start_controller(FAST)
        w0 = await add_worker(ctrl, "w0", slots=8, tasks={"lookup": LookupTask(), "guess": GuessTask()})
        async with EnvClient(ctrl.url) as env:
            await env.start_sample("lookup", "train-0")
            guesses = [await env.start_sample("guess", f"train-{i}") for i in range(2)]
            assert await finish(env, guesses[0].session_id) == (1.0, Status.COMPLETED)
            status = await env.status()
            assert status["sessions"] == {"lookup": 1, "guess": 1} and status["active_sessions"] == 2
            assert status["workers"][0]["free"] == 6
            by_route = status["latency_ms_by_route"]
            assert by_route["start_sample"]["count"] == 3 and by_route["interact"]["count"] >= 2
            overhead, total = status["overhead_ms"], status["latency_ms"]
            assert overhead["count"] == total["count"] and 0 < overhead["p50"] < total["p50"]
        await w0.stop()
        await ctrl.stop()
    run(main())
