"""A worker whose task fails every start says so: its heartbeats carry the task as unhealthy,
and the controller routes that task's sessions to other workers first."""
from __future__ import annotations

from typing import Any

from aio_helpers import run
from aiohttp.test_utils import TestClient, TestServer

from agentrl.config import ControllerConfig, EnvsConfig
from agentrl.serving.controller.registry import Registry
from agentrl.serving.worker import UNHEALTHY_AFTER, EnvWorker, create_worker_app
from agentrl.tasks.lookup import LookupTask


class PoisonedTask(LookupTask):
    """Every start fails, as every db session did once one session set `PRAGMA hard_heap_limit = 1`."""

    name = "poisoned"
    broken = True

    def start(self, index: str) -> Any:
        episode = super().start(index)  # an unknown index is the caller's bad_request
        if self.broken:
            raise MemoryError("out of memory")
        return episode


def test_a_task_failing_every_start_is_reported_and_avoided() -> None:
    async def main() -> None:
        task = PoisonedTask()
        worker = EnvWorker({"poisoned": task}, EnvsConfig(slots=4), ControllerConfig(), "w0")
        async with TestClient(TestServer(create_worker_app(worker))) as http:
            index = LookupTask().indices("train")[0]
            for _ in range(UNHEALTHY_AFTER):
                r = await http.post("/start_sample", json={"task": "poisoned", "index": index})
                assert r.status >= 500
            bad = await http.post("/start_sample", json={"task": "poisoned", "index": "no-such-index"})
            assert bad.status == 400  # the caller's mistake says nothing of the worker's health
            load = worker.load()
            assert list(load["unhealthy"]) == ["poisoned"] and "MemoryError" in load["unhealthy"]["poisoned"]
            assert load["failed_starts"] == UNHEALTHY_AFTER and worker.changed.is_set()
            task.broken = False
            r = await http.post("/start_sample", json={"task": "poisoned", "index": index})
            assert r.status == 200 and worker.unhealthy() == {}
        worker.shutdown()

    run(main())
    reg = Registry()
    for wid in ("w0", "w1"):
        reg.register(wid, f"http://{wid}:1", ["poisoned"], 4, [], now=0.0)
    assert reg.pick("poisoned").worker_id == "w0"
    assert reg.heartbeat("w0", 0, False, now=1.0, unhealthy={"poisoned": "MemoryError: out of memory"})
    assert reg.pick("poisoned").worker_id == "w1"
    assert reg.workers["w0"].to_wire()["unhealthy"] == {"poisoned": "MemoryError: out of memory"}
    reg.add_session("s", "poisoned", "w1", 1.0)
    reg.workers["w1"].slots = 1
    assert reg.pick("poisoned").worker_id == "w0"  # the last resort when no other has room
