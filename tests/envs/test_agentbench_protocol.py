"""`agentrl.tasks.protocol`: the call policies `Session` applies (first call only, lenient arguments),
AgentBench's first-value rule, the protocol option's default, and the argument-size bound that stays."""
from __future__ import annotations

import json
from typing import Any

import pytest

from agentrl.serving.session import MAX_ARGUMENT_BYTES, Session
from agentrl.tasks.api import Action, StepResult, ToolCall
from agentrl.tasks.protocol import STRICT, CallPolicy, first_value, parse_lenient, policy_of, resolve_protocol


class Recorder:
    """An episode that records the calls it receives, under a given policy."""

    def __init__(self, policy: CallPolicy) -> None:
        self.call_policy = policy
        self.seen: list[ToolCall] = []

    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "user", "content": "go"}]

    def step(self, action: Action) -> StepResult:
        self.seen += action.tool_calls
        return StepResult([])

    def expert_message(self) -> dict[str, Any]:
        return {"role": "assistant", "content": ""}


class RecorderTask:
    name, max_turns = "recorder", 5

    def __init__(self, policy: CallPolicy) -> None:
        self.policy = policy

    def tools(self) -> list[dict[str, Any]]:
        return [{"type": "function", "function": {"name": "go", "parameters": {
            "type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}}}]

    def indices(self, split: str) -> list[str]:
        return ["test-0"]

    def start(self, index: str) -> Recorder:
        return Recorder(self.policy)


def calls(*arguments: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": "go" if i else "other", "arguments": a}}
        for i, a in enumerate(arguments)]}


@pytest.mark.parametrize("policy, seen", [
    (CallPolicy(first_call_only=True, lenient_arguments=True), [("other", 5, None)]),
    (CallPolicy(first_call_only=False, lenient_arguments=True),
     [("other", 5, None), ("go", {"y": 1}, None), ("go", None, "arguments are not JSON")]),
    (STRICT, []),  # no call is valid: an unknown tool, a schema failure, bad JSON
])
def test_session_applies_the_episodes_policy(policy: CallPolicy, seen: list[tuple[str, Any, str | None]]) -> None:
    s = Session(RecorderTask(policy), "test-0")  # type: ignore[arg-type]
    r = s.interact(calls("5", json.dumps({"y": 1}), "{x"))
    got = [(c.name, c.arguments, c.error and c.error.split(" (")[0]) for c in s.episode.seen]
    assert got == seen
    assert (len(r.messages) == 3) is (policy == STRICT)  # strict answers each bad call itself


def test_lenient_still_bounds_argument_size() -> None:
    big = json.dumps({"x": "a" * MAX_ARGUMENT_BYTES})
    raw = {"id": "c0", "function": {"name": "go", "arguments": big}}
    assert parse_lenient(raw, 0, MAX_ARGUMENT_BYTES)[2:] == (None, f"arguments are too long (limit {MAX_ARGUMENT_BYTES} bytes)")
    assert parse_lenient({"function": {"name": "go", "arguments": {"x": 1}}}, 3, 10) == ("call_3", "go", {"x": 1}, None)
    assert parse_lenient("junk", 1, 10) == ("call_1", "", None, "the tool call has no function")


def test_first_value_and_defaults() -> None:
    assert first_value({"anything": "SELECT 1", "more": 2}) == "SELECT 1"
    for bad in ({}, ["SELECT 1"], "SELECT 1"):
        with pytest.raises(ValueError):
            first_value(bad)
    assert resolve_protocol(None, True, "db") == "faithful" and resolve_protocol("", False, "db") == "strict"
    assert resolve_protocol("strict", True, "db") == "strict"
    with pytest.raises(ValueError, match="unknown protocol"):
        resolve_protocol("loose", True, "db")
    task = RecorderTask(STRICT)
    task.call_policy = CallPolicy(first_call_only=True)  # type: ignore[attr-defined]
    assert policy_of(object(), task) == CallPolicy(first_call_only=True)
    assert policy_of(Recorder(CallPolicy(lenient_arguments=True)), task).lenient_arguments
