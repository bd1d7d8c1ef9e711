"""Helpers the task tests share: an assistant message with one tool call, an expert episode's reward."""
from __future__ import annotations

import json
from typing import Any

from agentrl.checks.expert import play
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
