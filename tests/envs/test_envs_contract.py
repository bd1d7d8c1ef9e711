"""The contract every task meets, built-in or user-registered, and the Session's failure handling."""
from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from agentrl.envs.api import Action, EnvError, Episode, Session, StepResult, Task, ToolBox, tool_message
from agentrl.envs.tasks import get_task, get_task_class, register_task, task_names
from agentrl.types import Status


def check_task_contract(task: Task, samples: int = 50, min_expert: float = 0.9) -> None:
    """What any task must satisfy; run it on your own task too."""
    assert isinstance(task, Task)
    assert isinstance(task.name, str) and task.name and task.max_turns >= 1
    tools = task.tools()
    ToolBox(tools)  # every schema is a valid JSON Schema
    for tool in tools:
        assert tool["type"] == "function" and {"name", "parameters"} <= set(tool["function"])
    train, test = task.indices("train"), task.indices("test")
    assert train and test and not set(train) & set(test)
    assert train == task.indices("train") and len(set(train)) == len(train)
    for split in (train, test):
        solved = 0
        for index in split[:samples]:
            session = Session(task, index)
            assert isinstance(session.episode, Episode)
            assert session.messages and all(m["role"] in ("system", "user") for m in session.messages)
            for _ in range(task.max_turns):
                result = session.interact(session.expert_message())
                if result.done:
                    break
            assert result.done and result.status != Status.RUNNING
            solved += result.reward > 0 and result.status == Status.COMPLETED
        assert solved >= min_expert * min(samples, len(split)), (task.name, solved)


@pytest.mark.parametrize("name", task_names())
def test_builtin_tasks_meet_the_contract(name: str) -> None:
    check_task_contract(get_task(name))


class EchoEpisode:
    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "user", "content": "say ok"}]

    def step(self, action: Action) -> StepResult:
        c = action.tool_calls[0]
        ok = c.arguments["text"] == "ok"
        return StepResult([tool_message(c.id, c.name, "done")], done=True, reward=float(ok), status=Status.COMPLETED)

    def expert_message(self) -> dict[str, Any]:
        return {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "say", "arguments": '{"text": "ok"}'}}]}


class EchoTask:
    """A user's own task: a class and a registry entry."""

    name = "echo"
    max_turns = 2

    def tools(self) -> list[dict[str, Any]]:
        return [{"type": "function", "function": {"name": "say", "parameters": {
            "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}]

    def indices(self, split: str) -> list[str]:
        return [f"{split}-{i}" for i in range(3)]

    def start(self, index: str) -> EchoEpisode:
        return EchoEpisode()


def test_user_task_registers_and_meets_the_contract() -> None:
    register_task("echo", EchoTask)
    assert "echo" in task_names() and get_task_class("echo") is EchoTask
    check_task_contract(get_task("echo"))
    from agentrl.envs.tasks.lookup import LookupTask

    assert get_task_class("agentrl.envs.tasks.lookup:LookupTask") is LookupTask  # the import-path form
    with pytest.raises(KeyError):
        get_task("no-such-task")


class BoomEpisode(EchoEpisode):
    def step(self, action: Action) -> StepResult:
        raise RuntimeError("disk on fire")

    def expert_message(self) -> dict[str, Any]:
        raise RuntimeError("no expert")


class BoomTask(EchoTask):
    name = "boom"

    def start(self, index: str) -> EchoEpisode:
        if index == "bad-start":
            raise RuntimeError("cannot start")
        return BoomEpisode()


def test_raising_task_ends_episode_as_env_error() -> None:
    session = Session(BoomTask(), "train-0")
    r = session.interact(EchoEpisode().expert_message())
    assert (r.done, r.reward, r.status) == (True, 0.0, Status.ENV_ERROR)
    assert r.messages[-1]["content"].startswith("Error: the environment failed (RuntimeError: disk on fire)")
    with pytest.raises(EnvError) as e:
        session.expert_message()
    assert e.value.code == "env_error"
    with pytest.raises(EnvError) as e:
        Session(BoomTask(), "bad-start")
    assert e.value.code == "env_error" and "cannot start" in e.value.message


def test_broken_schema_fails_at_toolbox_build() -> None:
    with pytest.raises(jsonschema.SchemaError):
        ToolBox([{"type": "function", "function": {"name": "x", "parameters": {"type": "nonsense"}}}])
