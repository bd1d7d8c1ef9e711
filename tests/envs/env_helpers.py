"""Helpers the task tests share: an assistant message with one tool call, an expert episode's reward, its
transcript and the calls in it."""
from __future__ import annotations

import json
from typing import Any

from agentrl.checks.expert import play
from agentrl.serving.session import Session
from agentrl.serving.wire_types import InteractResult
from agentrl.tasks.api import Task
from agentrl.types import Status


def call(name: str, args: Any, call_id: str = "c0") -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


def expert_reward(task: Task, index: str) -> float:
    """The reward of the scripted expert's episode on `index`, which must end by the task's own rule."""
    reward, status, _ = play(task, index)
    assert status == Status.COMPLETED, (index, status)
    return reward


def transcript(task: Task, index: str) -> tuple[list[dict[str, Any]], InteractResult]:
    """The expert's episode on `index`: the prompt, each move and its observations, in order; and its end."""
    session = Session(task, index)
    messages = list(session.messages)
    try:
        for _ in range(task.max_turns):
            move = session.expert_message()
            result = session.interact(move)
            messages += [move, *result.messages]
            if result.done:
                return messages, result
    finally:
        session.close()
    raise AssertionError(f"{task.name} {index}: the expert did not end the episode")


def moves(messages: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """The (tool, arguments) of every call the expert made."""
    return [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
