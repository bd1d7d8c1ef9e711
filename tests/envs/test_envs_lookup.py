"""The lookup task behind the shared Session checks: expert, rewards, splits, malformed actions."""
from __future__ import annotations

import json
import re
from typing import Any

import pytest

from agentrl.serving.session import Session
from agentrl.tasks.api import EnvError
from agentrl.tasks.lookup import FIELDS, NAMES, LookupTask, make_sample
from agentrl.types import Status


def call(name: str, arguments: Any, call_id: str = "call_0") -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"role": "assistant", "content": "",
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}]}


def run_expert(index: str) -> tuple[float, Status, int]:
    session = Session(LookupTask(), index)
    while True:
        result = session.interact(session.expert_message())
        if result.done:
            return result.reward, result.status, session.turns


def test_names_and_fields() -> None:
    assert len(NAMES) == 48 and len(set(NAMES)) == 48
    assert all(re.fullmatch(r"([bdfgklmnprstvz][aeiou]){2}", n) for n in NAMES)
    assert FIELDS == ("code", "shelf", "price", "stock", "size", "color", "weight", "rank")


def test_expert_solves_train_and_all_test() -> None:
    task = LookupTask()
    for index in task.indices("train")[:300] + task.indices("test"):
        assert run_expert(index) == (1.0, Status.COMPLETED, 2), index


def test_indices_deterministic_and_disjoint() -> None:
    task = LookupTask()
    train, test = task.indices("train"), task.indices("test")
    assert train[0] == "train-0" and train[-1] == "train-1999" and len(train) == 2000
    assert test[0] == "test-0" and test[-1] == "test-199" and len(test) == 200
    assert train == LookupTask().indices("train")
    assert not set(train) & set(test)
    assert make_sample("test-5") == make_sample("test-5")
    with pytest.raises(EnvError) as e:
        task.indices("dev")
    assert e.value.code == "bad_request"
    for bad in ("train-2000", "test-01", "x-1", "train"):
        with pytest.raises(EnvError):
            make_sample(bad)


def test_samples_vary_and_are_well_formed() -> None:
    samples = [make_sample(f"test-{i}") for i in range(200)]
    for s in samples:
        assert len(s.catalog) == 4 and s.target in s.catalog and s.field in FIELDS
        assert all(re.fullmatch(r"[1-9]\d", v) for rec in s.catalog.values() for v in rec.values())
    # test draws are not train draws: the model has to read the observation
    train_keys = {(s.target, s.field, s.answer) for s in (make_sample(f"train-{i}") for i in range(2000))}
    fresh = [s for s in samples if (s.target, s.field, s.answer) not in train_keys]
    assert len(fresh) > 100
    assert len({s.target for s in samples}) > 30 and len({s.field for s in samples}) == len(FIELDS)


def test_initial_messages_and_observation_text() -> None:
    sample = make_sample("train-7")
    session = Session(LookupTask(), "train-7")
    assert session.messages == [
        {"role": "system", "content": "You are an agent. Use the tools to answer."},
        {"role": "user", "content": f"What is the \"{sample.field}\" of \"{sample.target}\"?"}]
    r = session.interact(call("lookup", {"name": sample.target, "field": sample.field}))
    rec = sample.catalog[sample.target]
    assert r.messages == [{"role": "tool", "tool_call_id": "call_0", "name": "lookup", "content": rec[sample.field]}]
    assert not r.done and r.status == Status.RUNNING
    other = next(f for f in FIELDS if f != sample.field)  # any field of any catalog item can be read
    r = session.interact(call("lookup", {"name": sample.target, "field": other}, "call_1"))
    assert r.messages[0]["content"] == rec[other]
    r = session.interact(call("lookup", {"name": "qqqq", "field": "code"}, "call_2"))
    assert r.messages[0]["content"] == "Error: no item named 'qqqq'."


def test_wrong_answer_scores_zero() -> None:
    sample = make_sample("train-3")
    wrong = "10" if sample.answer != "10" else "11"
    r = Session(LookupTask(), "train-3").interact(call("submit_answer", {"answer": wrong}))
    assert (r.done, r.reward, r.status, r.metrics) == (True, 0.0, Status.COMPLETED, {"success": 0.0})
    r = Session(LookupTask(), "train-3").interact(call("submit_answer", {"answer": f" {sample.answer}\n"}))
    assert (r.done, r.reward, r.metrics) == (True, 1.0, {"success": 1.0})


def test_turn_limit() -> None:
    session = Session(LookupTask(), "train-0")
    for turn in range(1, 4):
        r = session.interact(call("lookup", {"name": "qqqq", "field": "code"}, f"call_{turn}"))
        assert not r.done, turn
    r = session.interact(call("lookup", {"name": "qqqq", "field": "code"}, "call_4"))
    assert (r.done, r.reward, r.status) == (True, 0.0, Status.TURN_LIMIT)
    with pytest.raises(EnvError):
        session.interact(call("lookup", {"name": "qqqq"}))


@pytest.mark.parametrize("message, role, expected", [
    (call("lookup", '{"name": "bako"'), "tool", "Error: arguments are not valid JSON"),
    (call("search", {"q": "x"}), "tool", "Error: unknown tool 'search'; the tools are: lookup, submit_answer."),
    (call("lookup", {"nam": "bako", "field": "code"}), "tool",
     "Error: invalid arguments for lookup: 'name' is a required property."),
    (call("lookup", {"name": 5, "field": "code"}), "tool",
     "Error: invalid arguments for lookup at name: 5 is not of type 'string'."),
    (call("lookup", {"name": "bako", "field": "colour"}), "tool",
     "Error: invalid arguments for lookup at field: 'colour' is not one of ['code', 'shelf', 'price', 'stock', 'size', 'color', 'weight', 'rank']."),
    (call("lookup", '["bako"]'), "tool", "Error: arguments must be a JSON object."),
    (call("lookup", {"name": "b" * 9000}), "tool", "Error: arguments are too long"),
    ({"role": "assistant", "content": "the answer is 42"}, "user", "Please call one of the tools: lookup, submit_answer."),
])
def test_malformed_actions_become_observations(message: dict[str, Any], role: str, expected: str) -> None:
    session = Session(LookupTask(), "train-1")
    r = session.interact(message)
    assert (r.done, r.status, session.turns) == (False, Status.RUNNING, 1)
    assert len(r.messages) == 1
    assert r.messages[0]["role"] == role and r.messages[0]["content"].startswith(expected), r.messages
    if role == "tool":
        assert r.messages[0]["tool_call_id"] == "call_0"


def test_malformed_actions_count_as_turns() -> None:
    session = Session(LookupTask(), "train-1")
    results = [session.interact({"role": "assistant", "content": "hmm"}) for _ in range(4)]
    assert [r.done for r in results] == [False, False, False, True]
    assert results[-1].status == Status.TURN_LIMIT


def test_valid_and_invalid_calls_in_one_message() -> None:
    sample = make_sample("train-2")
    message = call("lookup", "{oops")
    message["tool_calls"].append(call("submit_answer", {"answer": sample.answer}, "call_1")["tool_calls"][0])
    r = Session(LookupTask(), "train-2").interact(message)
    assert r.messages[0]["tool_call_id"] == "call_0" and r.messages[0]["content"].startswith("Error:")
    assert r.messages[1]["tool_call_id"] == "call_1"
    assert (r.done, r.reward) == (True, 1.0)


def test_bad_message_shape_is_a_bad_request() -> None:
    session = Session(LookupTask(), "train-0")
    for bad in ("text", {"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": "x"}):
        with pytest.raises(EnvError) as e:
            session.interact(bad)
        assert e.value.code == "bad_request"
