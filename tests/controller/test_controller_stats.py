"""The controller's statistics in TensorBoard (`agentrl.serving.controller.stats`): a real controller and worker over
sockets in this process, two sessions held, the worker killed; the event file read back must hold what
/status said at each write, under the names of docs/architecture.md §9."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aio_helpers import run, wait_until

from agentrl.config import ControllerConfig, EnvsConfig
from agentrl.monitor.tensorboard import EventMonitor
from agentrl.serving.client import EnvClient
from agentrl.serving.controller.server import start_controller
from agentrl.serving.controller.stats import log_periodically, scalars_of
from agentrl.serving.worker import start_worker

CFG = ControllerConfig(heartbeat_s=0.05, dead_after_s=0.4, session_idle_s=30.0, request_timeout_s=5.0)


def _read(tb: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_scalars_over_time_from_a_real_controller(tmp_path: Path) -> None:
    seen: list[dict] = []

    monitor = EventMonitor(tmp_path / "tb", "controller")  # the controller's: TensorBoard's writer, no torch

    async def main() -> None:
        ctrl = await start_controller(CFG)
        worker = await start_worker(EnvsConfig(tasks=("lookup",), slots=8, expert_route="enabled"), CFG, ctrl.url,
                                    "w0")
        reg = ctrl.controller.registry
        await wait_until(lambda: "w0" in reg.workers and reg.workers["w0"].alive)
        ticks = iter([100.0, 100.0, 107.4])  # t0, the first write, the write on the way out

        def status() -> dict:
            seen.append(ctrl.controller.status_dict())
            return seen[-1]

        async with EnvClient(ctrl.url) as env:
            for i in range(3):  # three whole episodes: latency samples
                start = await env.start_sample("lookup", f"test-{i}")
                while not (await env.interact(start.session_id, await env.expert(start.session_id))).done:
                    pass
            for i in range(2):
                await env.start_sample("lookup", f"train-{i}")  # held open
            task = asyncio.create_task(log_periodically(status, monitor, 3600.0, ("lookup", "unlock"),
                                                        clock=lambda: next(ticks)))
            await wait_until(lambda: len(seen) == 1)
            await worker.stop_heartbeats()  # killed: no heartbeats, no goodbye
            await worker.http.close()
            await worker.runner.cleanup()
            await wait_until(lambda: not reg.workers["w0"].alive, timeout_s=10.0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        monitor.close()
        await ctrl.stop()

    run(main())
    got = _read(tmp_path / "tb")
    first, last = seen
    assert got["env/active_sessions"] == [(0, 2.0), (7, 0.0)]
    assert got["env/sessions/lookup"] == [(0, 2.0), (7, 0.0)]
    assert got["env/sessions/unlock"] == [(0, 0.0), (7, 0.0)]  # a configured task without sessions: 0, not absent
    assert got["env/errors"] == [(0, 0.0), (7, 2.0)]
    assert got["env/errors/worker_died"][-1] == (7, 2.0)  # the two held sessions, each counted once
    assert got["env/workers_live"] == [(0, 1.0), (7, 0.0)]
    assert first["latency_ms"]["count"] >= 9 and first["latency_ms"]["p99"] > 0
    for tag, at in (("env/latency_p99", "p99"), ("env/latency_p50", "p50")):
        assert [v for _, v in got[tag]] == pytest.approx([first["latency_ms"][at], last["latency_ms"][at]], rel=1e-6)
    assert {t for t in got if t.startswith("env/")} == set(scalars_of(last, ("lookup", "unlock")))


def test_event_monitor_text_reads_back(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    m = EventMonitor(tmp_path, "controller")
    m.text("config", "    a: 1", 0)
    m.close()
    acc = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    acc.Reload()
    assert acc.Tensors("config")[0].tensor_proto.string_val == [b"    a: 1"]
