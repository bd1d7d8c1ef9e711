"""The bfcl task: BFCL multi-turn cases from bfcl-eval's data, its backends and its checker; the gold
replay passes, a wrong call fails, and the task is evaluation-only."""
from __future__ import annotations

import json
from typing import Any

import pytest

from agentrl.serving.session import Session
from agentrl.tasks import get_task
from agentrl.tasks.api import EnvError

pytest.importorskip("bfcl_eval", reason="bfcl-eval is installed by install.sh (pip install --no-deps bfcl-eval)")

from agentrl.tasks.bfcl import BfclTask, decoded_call, parse_call, to_tool  # noqa: E402
from agentrl.types import Status  # noqa: E402


def calls(*pairs: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for i, (n, a) in enumerate(pairs)]}


def done() -> dict[str, Any]:
    return {"role": "assistant", "content": "Done."}


@pytest.fixture(scope="module")
def task() -> BfclTask:
    return BfclTask()


def play_expert(task: BfclTask, index: str) -> Any:
    s = Session(task, index)
    for _ in range(task.max_turns):
        r = s.interact(s.expert_message())
        if r.done:
            return r
    raise AssertionError(index)


def test_cases_tools_and_splits(task: BfclTask) -> None:
    assert task.indices("test")[:2] == ["test-0", "test-1"] and len(task.indices("test")) == 200
    with pytest.raises(EnvError, match="evaluation task") as e:
        task.indices("train")
    assert e.value.code == "bad_request"
    assert len(task.tools()) == 128 and isinstance(get_task("bfcl"), BfclTask)
    s = Session(task, "test-0")  # GorillaFileSystem + TwitterAPI: the episode offers only those classes' tools
    names = {t["function"]["name"] for t in s.tools}
    assert {"cd", "mv", "grep", "post_tweet"} <= names and "get_flight_cost" not in names
    assert s.messages == [{"role": "user", "content": "Move 'final_report.pdf' within document directory to 'temp' "
                           "directory in document. Make sure to create the directory"}]


def test_schema_conversion() -> None:
    tool = to_tool({"name": "add", "description": "Add.", "parameters": {"type": "dict", "properties": {
        "a": {"type": "float", "description": "x"}, "b": {"type": "array", "items": {"type": "float"}},
        "c": {"type": "dict", "properties": {"d": {"type": "tuple"}}}}, "required": ["a"]}})
    p = tool["function"]["parameters"]
    assert p["type"] == "object" and p["properties"]["a"]["type"] == "number"
    assert p["properties"]["b"]["items"]["type"] == "number" and p["properties"]["c"]["properties"]["d"]["type"] == "array"


def test_call_forms(task: BfclTask) -> None:
    ep = task.start("test-0")
    assert parse_call("sort('final_report.pdf')", ep.signatures) == ("sort", {"file_name": "final_report.pdf"})
    assert parse_call("tail(file_name='log.txt',lines=20)", ep.signatures) == ("tail", {"file_name": "log.txt", "lines": 20})
    assert decoded_call("mv", {"source": "a", "destination": "b"}) == "mv(source='a',destination='b')"


def test_gold_replay_passes_the_checker(task: BfclTask) -> None:
    for index in task.indices("test")[:10]:
        r = play_expert(task, index)
        assert (r.reward, r.status) == (1.0, Status.COMPLETED), (index, r.metrics)
        assert r.metrics["turns_passed"] == r.metrics["turns"]


def test_gold_replay_fails_only_where_the_gold_breaks_its_own_schema(task: BfclTask) -> None:
    """test-173's last ground-truth call passes the string 'ticket_001' for close_ticket's integer
    ticket_id: the environment refuses it, so that case cannot pass; it fails at that turn, not earlier."""
    r = play_expert(task, "test-173")
    assert (r.reward, r.status, r.metrics["turns_passed"], r.metrics["turns"]) == (0.0, Status.COMPLETED, 3.0, 4.0)


def test_a_wrong_call_fails_the_checker(task: BfclTask) -> None:
    s = Session(task, "test-0")
    # turn 0 asks to move final_report.pdf into a new document/temp: make the folder with another name
    r = s.interact(calls(("cd", {"folder": "document"}), ("mkdir", {"dir_name": "tmp"}),
                         ("mv", {"source": "final_report.pdf", "destination": "tmp"})))
    assert [m["role"] for m in r.messages] == ["tool"] * 3 and not r.done
    assert r.messages[0]["content"] == '{"current_working_directory": "document"}'
    r = s.interact(done())
    assert r.messages[0]["role"] == "user" and "budget analysis" in r.messages[0]["content"]
    while not r.done:
        r = s.interact(s.expert_message())
    assert (r.reward, r.status, r.metrics["turns_passed"]) == (0.0, Status.COMPLETED, 0.0)


def test_malformed_calls_and_backend_errors_are_observations(task: BfclTask) -> None:
    s = Session(task, "test-0")
    r = s.interact(calls(("launch_rocket", {})))
    assert r.messages[0]["content"].startswith("Error: unknown tool 'launch_rocket'") and not r.done
    r = s.interact(calls(("cd", {"folder": 3})))  # schema: folder is a string
    assert "is not of type 'string'" in r.messages[0]["content"]
    r = s.interact(calls(("cd", {"folder": "no_such_dir"})))  # the backend's own error, as BFCL shows it
    assert "No such file or directory" in r.messages[0]["content"] and not r.done
    r = play_expert(task, "test-0")
    assert r.reward == 1.0


def test_force_quit_after_twenty_steps_in_a_turn(task: BfclTask) -> None:
    s = Session(task, "test-0")
    for _ in range(20):
        assert not s.interact(calls(("pwd", {}))).done
    r = s.interact(calls(("pwd", {})))
    assert (r.done, r.reward, r.status) == (True, 0.0, Status.TURN_LIMIT)
    assert "forced to quit after 20 steps" in r.messages[-1]["content"]


def test_cases_in_threads(task: BfclTask) -> None:
    """The worker runs this task in threads; the checker keeps its instances in shared module globals."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        rewards = list(pool.map(lambda i: play_expert(task, i).reward, task.indices("test")[10:26]))
    assert rewards == [1.0] * 16


@pytest.mark.slow
def test_gold_pass_rate_over_all_base_cases(task: BfclTask) -> None:
    failed = [i for i in task.indices("test") if play_expert(task, i).reward < 1.0]
    assert failed == ["test-173"]


def test_a_number_too_long_to_print_is_an_observation(task: BfclTask) -> None:
    """`power(10, 5000)` returned an integer Python refuses to print (over 4,300 digits), which
    raised out of the step and ended the episode as env_error. It is the backend's error, shown as BFCL shows
    one. (`power(10, 14758103)` holds the interpreter lock for seconds: the session's own process and the
    message budget take care of it, `python -m jobs.attack_check --tasks bfcl`.)"""
    s = Session(task, "test-15")  # GorillaFileSystem and MathAPI
    r = s.interact(calls(("power", {"base": 10, "exponent": 5000})))
    assert not r.done and r.messages[0]["content"].startswith("Error during execution: Exceeds the limit"), r
