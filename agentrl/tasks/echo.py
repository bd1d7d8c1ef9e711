"""`echo`: a task that costs nothing to run, for load-testing the controller and workers.

`echo(text)` answers with the same text; `finish()` ends the episode with reward 1.0. A session
lives as long as its client keeps calling `echo` (the turn limit is effectively unbounded), so a
benchmark can hold thousands of sessions and measure only the controller's own cost. The scripted
expert echoes once, then finishes. Samples carry no data: every index of a split is the same
episode, and indices exist only so that `start_sample` has something to name.

Not meant for training: it teaches nothing. `jobs/bench_controller.py` serves it.
"""
from __future__ import annotations

from typing import Any

from agentrl.tasks.api import Action, EnvError, StepResult, tool_message
from agentrl.types import Status

SPLIT_SIZES: dict[str, int] = {"train": 100_000, "test": 1_000}

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "echo", "description": "Answer with the given text.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                       "required": ["text"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "finish", "description": "End the episode.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}},
]


def _call(name: str, arguments: str, call_id: str) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]}


class EchoEpisode:
    def __init__(self, index: str) -> None:
        self.index = index
        self.echoed = 0

    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "user", "content": f"Echo something, then finish ({self.index})."}]

    def step(self, action: Action) -> StepResult:
        out = []
        for call in action.tool_calls:
            if call.name == "finish":
                out.append(tool_message(call.id, call.name, "bye"))
                return StepResult(out, done=True, reward=1.0, status=Status.COMPLETED,
                                  metrics={"echoed": float(self.echoed)})
            self.echoed += 1
            out.append(tool_message(call.id, call.name, call.arguments["text"]))
        return StepResult(out)

    def expert_message(self) -> dict[str, Any]:
        if self.echoed == 0:
            return _call("echo", '{"text": "hello"}', "call_echo")
        return _call("finish", "{}", "call_finish")


class EchoTask:
    name = "echo"
    max_turns = 1_000_000_000
    """Unbounded in practice: a benchmark session ends when its client says so."""
    isolation = "thread"  # its one tool copies a bounded string: no process per session for a benchmark

    def tools(self) -> list[dict[str, Any]]:
        return TOOLS

    def indices(self, split: str) -> list[str]:
        if split not in SPLIT_SIZES:
            raise EnvError("bad_request", f"echo has no split {split!r} (splits: train, test)")
        return [f"{split}-{i}" for i in range(SPLIT_SIZES[split])]

    def start(self, index: str) -> EchoEpisode:
        split, _, num = index.partition("-")
        if split not in SPLIT_SIZES or not num.isdigit() or int(num) >= SPLIT_SIZES[split] or num != str(int(num)):
            raise EnvError("bad_request", f"echo has no sample {index!r}")
        return EchoEpisode(index)
