"""A call's JSON arguments and a message's text, whatever a policy writes: one reader
(`json_args.loads_arguments`) for the env's ToolBox, the faithful protocol and the rollout's parser, whose
every refusal is the call's own error observation. On 5d8debb a 4,301-digit integer and an unpaired
surrogate in the arguments answered HTTP 502 (env_error: dropped from training, so a policy could prefer
it), NaN and 1e999 passed as numbers."""
from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer

from agentrl.config import ControllerConfig, EnvsConfig
from agentrl.serving.session import ToolBox
from agentrl.serving.wire_types import InteractResult
from agentrl.serving.worker import EnvWorker, create_worker_app
from agentrl.tasks.json_args import ArgumentsError, clean_message, clean_text, loads_arguments
from agentrl.tasks.lookup import LookupTask
from agentrl.tasks.protocol import parse_lenient
from agentrl.types import Status

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize(("text", "says"), [
    ('{"x": ' + "7" * 4301 + "}", "an integer of 4301 digits; the limit is 4300"),
    ('{"x": -' + "7" * 5000 + "}", "an integer of 5000 digits"),
    ('{"x": "\\ud800"}', "an unpaired surrogate \\ud800 is not text"),
    ('{"\\udc00": 1}', "an unpaired surrogate \\udc00"),
    ('{"x": "\udfff"}', "an unpaired surrogate \\udfff"),
    ('{"x": NaN}', "NaN is not a JSON number"),
    ('{"x": -Infinity}', "-Infinity is not a JSON number"),
    ('{"x": 1e999}', "the number 1e999 is out of range"),
    ('{"x": ' + "[" * 40 + "]" * 40 + "}", "nested too deeply (41 levels, limit 32)"),
    ('{"x": ' + "[" * 5000, "nested too deeply"),
    ('{"x": ', "not valid JSON (Expecting value at position 6)"),
])
def test_every_refusal_is_an_arguments_error(text: str, says: str) -> None:
    with pytest.raises(ArgumentsError) as e:
        loads_arguments(text)
    assert says in str(e.value)
    problem, args = ToolBox(TOOLS)._check_call("f", text)
    assert problem == f"arguments are {e.value}." and args == {}


def test_what_is_json_reads_as_before() -> None:
    assert loads_arguments('{"x": [1, -2.5e3, "\\ud83d\\ude00", null, true], "y": "' + "7" * 4300 + '"}') == {
        "x": [1, -2500.0, "\U0001f600", None, True], "y": "7" * 4300}
    assert loads_arguments('{"x": ' + "7" * 4300 + "}")["x"] == int("7" * 4300)
    assert loads_arguments('{"x": NaN}', finite=False)["x"] != 0  # the faithful protocol's json.loads
    assert parse_lenient({"function": {"name": "f", "arguments": '{"x": NaN}'}}, 0, 1000)[3] is None
    assert "unpaired surrogate" in parse_lenient({"function": {"name": "f", "arguments": '"\\ud800"'}}, 0, 1000)[3]
    assert "nested too deeply" in parse_lenient({"function": {"name": "f", "arguments": "[" * 5000}}, 0, 10**5)[3]


def test_text_loses_unpaired_surrogates_only() -> None:
    assert clean_text("a \ud800 b \U0001f600") == "a \ufffd b \U0001f600"
    msg = {"role": "assistant", "content": "\udfff", "tool_calls": [
        {"id": "c\ud800", "function": {"name": "f\ud800", "arguments": '{"x": "\ud800"}'}}]}
    out = clean_message(msg)
    assert out["content"] == "\ufffd" and out["tool_calls"][0]["id"] == "c\ufffd"
    assert out["tool_calls"][0]["function"] == {"name": "f\ufffd", "arguments": '{"x": "\ud800"}'}
    assert msg["content"] == "\udfff"  # the caller's message is not changed


def test_a_nan_reward_from_an_env_is_not_read_as_a_number() -> None:
    wire = {"messages": [], "done": True, "reward": float("nan"), "status": "completed"}
    with pytest.raises(ValueError):
        InteractResult.from_wire(wire)
    assert InteractResult.from_wire({**wire, "reward": 1.0}).reward == 1.0


def test_over_http_each_is_an_observation_and_the_session_goes_on() -> None:
    async def main() -> None:
        worker = EnvWorker({"lookup": LookupTask()}, EnvsConfig(slots=2), ControllerConfig(), "w")
        async with TestClient(TestServer(create_worker_app(worker))) as http:
            for arguments in ('{"name": ' + "7" * 4301 + "}", '{"name": "\\ud800"}', '{"name": "\ud800"}',
                              '{"name": NaN}', '{"name": 1e999}'):
                start = await (await http.post("/start_sample", json={"task": "lookup", "index": "test-0"})).json()
                sid = start["session_id"]
                r = await http.post("/interact", json={"session_id": sid, "message": {
                    "role": "assistant", "content": "\ud800", "tool_calls": [
                        {"id": "c", "type": "function", "function": {"name": "lookup", "arguments": arguments}}]}})
                assert r.status == 200, await r.text()
                out = await r.json()
                assert out["status"] == Status.RUNNING.value and not out["done"]
                assert out["messages"][0]["content"].startswith("Error: arguments are not valid JSON"), out
                await http.post("/cancel", json={"session_id": sid})
            assert worker.counters["unhandled"] == 0 and not worker.sessions
    asyncio.run(main())
