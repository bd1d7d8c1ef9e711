"""An env worker process serving test tasks for the fault tests (`test_worker_faults.py`).

    python tests/envs/fault_worker.py RUN_DIR WORKER_ID SLOTS

It serves `lookup`, `nap` and `spin` (a CPU-bound `nap` of a task that says it does not block) with the run dir's controller settings and secret, registers with the
controller published there, and runs until killed. `nap` is a blocking task whose one tool sleeps for
as long as the model asks (a legal `sleep 9` in an `os` sandbox, without the sandbox), and reports how
many of its episode's calls ever ran at once.
"""
from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path
from typing import Any

from agentrl.auth import run_secret
from agentrl.config import EnvsConfig, load_config
from agentrl.launch import rendezvous
from agentrl.serving.worker import start_worker
from agentrl.tasks.api import Action, StepResult, tool_message
from agentrl.tasks.lookup import LookupTask


class NapEpisode:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inside = 0
        self.most = 0

    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "user", "content": "take a nap"}]

    def step(self, action: Action) -> StepResult:
        call = action.tool_calls[0]
        with self.lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
        try:
            time.sleep(call.arguments["seconds"])
        finally:
            with self.lock:
                self.inside -= 1
        end = call.arguments.get("end", False)
        return StepResult([tool_message(call.id, call.name, f"slept; most calls at once: {self.most}")],
                          done=end, reward=1.0 if end else 0.0)

    def expert_message(self) -> dict[str, Any]:
        return {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "nap", "arguments": '{"seconds": 0, "end": true}'}}]}


class NapTask:
    name = "nap"
    max_turns = 100
    blocking = True
    isolation = "thread"  # these tests check the worker's own deadline on its threads (processes: test_isolation)

    def tools(self) -> list[dict[str, Any]]:
        return [{"type": "function", "function": {"name": "nap", "parameters": {
            "type": "object", "properties": {"seconds": {"type": "number", "minimum": 0}, "end": {"type": "boolean"}},
            "required": ["seconds"], "additionalProperties": False}}}]

    def indices(self, split: str) -> list[str]:
        return [f"{split}-{i}" for i in range(100)]

    def start(self, index: str) -> NapEpisode:
        return NapEpisode()


class SpinTask(NapTask):
    """`nap` that burns the CPU in Python instead of sleeping, and says it does not block (as kg did)."""

    name = "spin"
    blocking = False

    def start(self, index: str) -> NapEpisode:
        episode = NapEpisode()
        episode.step = lambda action: spin(action)  # type: ignore[method-assign]
        return episode


def spin(action: Action) -> StepResult:
    call = action.tool_calls[0]
    deadline = time.monotonic() + call.arguments["seconds"]
    n = 0
    while time.monotonic() < deadline:
        n += 1
    return StepResult([tool_message(call.id, call.name, f"spun {n > 0}")], done=True, reward=1.0)


async def main(run_dir: Path, worker_id: str, slots: int) -> None:
    cfg = load_config(str(run_dir / "config.yaml"))
    url = await asyncio.to_thread(rendezvous.wait_for, run_dir, "controller_url", 60.0)
    envs = EnvsConfig(tasks=("lookup", "nap", "spin"), slots=slots)
    tasks = {"lookup": LookupTask(), "nap": NapTask(), "spin": SpinTask()}
    running = await start_worker(envs, cfg.controller, url, worker_id, tasks=tasks,  # type: ignore[arg-type]
                                 secret=run_secret(run_dir), expert_route=True)
    print(running.address, flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])))
