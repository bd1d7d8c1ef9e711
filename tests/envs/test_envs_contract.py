"""The contract every task meets (agentrl.checks.contract), built-in or user-registered; each rule it
enforces, shown failing on a task that breaks it; and the Session's failure handling."""
from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from system_tools import missing_system_tool

from agentrl.checks.contract import ContractError, check_task
from agentrl.sandbox import SandboxUnavailable
from agentrl.serving.session import Session, ToolBox
from agentrl.tasks import get_task, get_task_class, register_task, task_names
from agentrl.tasks.api import Action, EnvError, StepResult, tool_message
from agentrl.tasks.example import TOOLS, GuessEpisode, GuessTask, secret_of
from agentrl.types import Status


@pytest.mark.parametrize("name", task_names())
def test_builtin_tasks_meet_the_contract(name: str) -> None:
    task = get_task(name)
    splits = getattr(task, "splits", ("train", "test"))  # an evaluation-only task (bfcl) has only "test"
    try:
        report = check_task(task, splits=splits)
    except SandboxUnavailable as e:  # the os task without bubblewrap: skipped here, a failure in CI
        missing_system_tool(f"task {name!r} cannot run its sandbox: {e}")
    assert all(report.played[split] == min(20, len(task.indices(split))) for split in splits)


def test_the_documented_example_meets_the_contract() -> None:
    from agentrl.tasks.example import GuessTask

    report = check_task(GuessTask(), samples=50)
    assert report.solved == {"train": 50, "test": 50} and 1 < report.turns["test"] <= 7


def test_docs_show_the_example_verbatim() -> None:
    """docs/tasks.md embeds agentrl/tasks/example.py; the two must not drift apart."""
    root = Path(__file__).resolve().parents[2]
    doc = (root / "docs" / "tasks.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    assert (root / "agentrl/tasks/example.py").read_text() in blocks


class SayEpisode:
    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "user", "content": "say ok"}]

    def step(self, action: Action) -> StepResult:
        c = action.tool_calls[0]
        ok = c.arguments["text"] == "ok"
        return StepResult([tool_message(c.id, c.name, "done")], done=True, reward=float(ok), status=Status.COMPLETED)

    def expert_message(self) -> dict[str, Any]:
        return {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "say", "arguments": '{"text": "ok"}'}}]}


class SayTask:
    """A user's own task: a class and a registry entry."""

    name = "say"
    max_turns = 2

    def tools(self) -> list[dict[str, Any]]:
        return [{"type": "function", "function": {"name": "say", "parameters": {
            "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}]

    def indices(self, split: str) -> list[str]:
        if split not in ("train", "test"):
            raise EnvError("bad_request", f"no split {split!r}")
        return [f"{split}-{i}" for i in range(3)]

    def start(self, index: str) -> SayEpisode:
        if index not in self.indices(index.partition("-")[0] if "-" in index else "none"):
            raise EnvError("bad_request", f"no sample {index!r}")
        return SayEpisode()


def test_user_task_registers_and_meets_the_contract() -> None:
    register_task("say", SayTask)
    assert "say" in task_names() and get_task_class("say") is SayTask
    assert check_task(get_task("say")).solved == {"train": 3, "test": 3}
    from agentrl.tasks.lookup import LookupTask

    assert get_task_class("agentrl.tasks.lookup:LookupTask") is LookupTask  # the import-path form
    with pytest.raises(KeyError):
        get_task("no-such-task")


# ------------------------------------------------------------------ each rule, broken on purpose

class _Bad(GuessTask):
    """The documented example with one defect, set by a subclass below."""


class ArraySchema(_Bad):
    def tools(self) -> list[dict[str, Any]]:
        return [{"type": "function", "function": {"name": "guess", "parameters": {"type": "array"}}}]


class TwoToolsOneName(_Bad):
    def tools(self) -> list[dict[str, Any]]:
        return TOOLS + TOOLS


class SharedSplits(_Bad):
    def indices(self, split: str) -> list[str]:
        return super().indices("train")


class SilentUnknownSplit(_Bad):
    def indices(self, split: str) -> list[str]:
        return super().indices(split) if split in ("train", "test") else []


class CrashOnUnknownIndex(_Bad):
    def start(self, index: str) -> GuessEpisode:
        return GuessEpisode(int(index.split("-")[1]) % 100 + 1)


class RandomStart(_Bad):
    def start(self, index: str) -> GuessEpisode:
        secret_of(index)
        return GuessEpisode(random.randint(1, 100))


class AssistantInPrompt(_Bad):
    def start(self, index: str) -> GuessEpisode:
        ep = super().start(index)
        ep.initial_messages = lambda: [{"role": "assistant", "content": "hi"}]  # type: ignore[method-assign]
        return ep


class WrongCallId(_Bad):
    def start(self, index: str) -> GuessEpisode:
        ep = super().start(index)
        step = ep.step

        def renamed(action: Action) -> StepResult:
            r = step(action)
            r.messages = [{**m, "tool_call_id": "someone-else"} for m in r.messages]
            return r
        ep.step = renamed  # type: ignore[method-assign]
        return ep


class NumberContent(_Bad):
    def start(self, index: str) -> GuessEpisode:
        ep = super().start(index)
        step = ep.step

        def numeric(action: Action) -> StepResult:
            r = step(action)
            r.messages = [{**m, "content": 42} for m in r.messages]
            return r
        ep.step = numeric  # type: ignore[method-assign]
        return ep


class LazyExpert(_Bad):
    def start(self, index: str) -> GuessEpisode:
        ep = super().start(index)
        ep.low = ep.high = 1  # always guesses 1: wins 1 game in 100
        return ep


@pytest.mark.parametrize(("task_cls", "rule"), [
    (ArraySchema, "tools"), (TwoToolsOneName, "tools"), (SharedSplits, "indices"),
    (SilentUnknownSplit, "indices"), (CrashOnUnknownIndex, "start"), (RandomStart, "start"),
    (AssistantInPrompt, "start"), (WrongCallId, "interact"), (NumberContent, "interact"), (LazyExpert, "expert"),
])
def test_contract_names_the_broken_rule(task_cls: type, rule: str) -> None:
    random.seed(0)  # RandomStart's two starts of one index then differ, on every run
    with pytest.raises(ContractError) as e:
        check_task(task_cls(), samples=10)
    assert str(e.value).startswith(f"{rule}:"), str(e.value)


class BoomEpisode(SayEpisode):
    def step(self, action: Action) -> StepResult:
        raise RuntimeError("disk on fire")

    def expert_message(self) -> dict[str, Any]:
        raise RuntimeError("no expert")


class BoomTask(SayTask):
    name = "boom"

    def start(self, index: str) -> SayEpisode:
        if index == "bad-start":
            raise RuntimeError("cannot start")
        return BoomEpisode()


def test_raising_task_ends_episode_as_env_error() -> None:
    session = Session(BoomTask(), "train-0")
    r = session.interact(SayEpisode().expert_message())
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


def test_equal_schemas_in_another_key_order_keep_their_own_messages() -> None:
    """Validators are shared between tool boxes with the same schema; one that lists `additionalProperties`
    first (as a YAML file's sorted keys may) must not change which error another task's calls get."""
    def box(params: dict) -> ToolBox:
        return ToolBox([{"type": "function", "function": {"name": "run", "parameters": params}}])

    ours = {"type": "object", "properties": {"script": {"type": "string"}}, "required": ["script"],
            "additionalProperties": False}
    sorted_first = box(dict(sorted(ours.items())))  # the same schema, keys in another order, compiled first
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c0", "type": "function", "function": {"name": "run", "arguments": '{"cmd": "ls"}'}}]}
    assert "Additional properties" in sorted_first.check(call)[1][0]["content"]
    assert "'script' is a required property" in box(ours).check(call)[1][0]["content"]
