"""The `os` task's faithful protocol: AgentBench-FC's reading of each message, its finish
semantics and observations, with the tools and prompts read from the checkout at run time."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from os_fixtures import SYSTEM, agentbench_checkout
from sandbox_helpers import require_sandbox

from agentrl.checks.expert import play
from agentrl.serving.session import Session
from agentrl.tasks.os_task import FaithfulOsEpisode, OsTask, parse_problem
from agentrl.tasks.os_task import faithful as ab
from agentrl.types import Status


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> OsTask:
    require_sandbox()
    checkout = agentbench_checkout(tmp_path_factory.mktemp("agentbench"))
    return OsTask(source="agentbench", agentbench_dir=checkout, sandbox={"backend": "bwrap", "command_timeout_s": 3.0})


def calls(*pairs: tuple[str, Any]) -> dict[str, Any]:
    """An assistant message with these (name, arguments) calls; arguments that are not str are JSON-encoded."""
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a if isinstance(a, str) else json.dumps(a)}}
        for i, (n, a) in enumerate(pairs)]}


def episode(task: OsTask, item: dict[str, Any]) -> Session:
    session = Session(task, "dev-0")
    session.episode = FaithfulOsEpisode(parse_problem(item, None), task.sandbox, task.prompts, task.budget)  # type: ignore[arg-type]
    return session


MATCH = {"description": "d", "evaluation": {"match": "42"}}


def test_prompts_and_tools_come_from_the_checkout(task: OsTask) -> None:
    assert task.protocol == "faithful" and task.sizes == {"train": 1, "test": 4, "dev": 26}
    session = Session(task, "test-0")
    assert session.messages == [{"role": "system", "content": SYSTEM},
                                {"role": "user", "content": "PROBLEM FROM THE CHECKOUT:\n\nx0"}]
    assert [t["function"]["name"] for t in session.tools] == ["bash_action", "finish_action", "answer_action"]
    session.close()


def test_protocol_parsing_by_agentbench_rules() -> None:
    assert ab.parse_action({"content": "hi"}).kind == "none"
    a = ab.parse_action(calls(("bash_action", {"cmd": "ls", "x": 1}), ("answer_action", {"answer": "1"})))
    assert (a.kind, a.content, a.call_id) == ("bash", "ls", "c0")  # the first call, its first value
    assert ab.parse_action(calls(("finish_action", {"thought": "42"}))).content == "42"
    assert ab.parse_action(calls(("finish_action", {}))).content is None
    assert ab.parse_action(calls(("answer_action", {}))).kind == "crash"
    assert ab.parse_action(calls(("run", {"a": 1}))).kind == "invalid"
    bad = ab.parse_action(calls(("bash_action", "{ls")))
    assert bad.kind == "error" and bad.text.startswith("Expecting property name")  # json's own message
    assert ab.observation("") == "The output of the OS is empty."
    assert ab.observation("x" * 900) == "The output of the OS:\n\n" + "x" * 780 + "\n[truncated because the output is too long]"


def test_first_call_only_and_any_argument_key(task: OsTask) -> None:
    session = episode(task, MATCH)
    r = session.interact(calls(("bash_action", {"command": "echo 42 > /root/a; cat /root/a"}), ("answer_action", {"answer": "42"})))
    assert not r.done and r.messages == [{"role": "tool", "tool_call_id": "c0", "name": "bash_action",
                                          "content": "The output of the OS:\n\n42\n"}]
    r = session.interact(calls(("bash_action", {"script": 5})))  # not a string: nothing runs
    assert r.messages[0]["content"] == "The output of the OS is empty."
    r = session.interact({"role": "assistant", "content": "I think"})
    assert r.messages == [{"role": "user", "content": ab.NO_CALL}] and not r.done
    r = session.interact(calls(("ls", {"a": 1})))
    assert r.messages[0]["content"] == ab.INVALID_CALL and not r.done
    r = session.interact(calls(("answer_action", {"value": " 42 "})))
    assert (r.done, r.reward, r.status, r.messages) == (True, 1.0, Status.COMPLETED, [])


def test_finish_thought_is_the_answer(task: OsTask) -> None:
    session = episode(task, MATCH)
    r = session.interact(calls(("finish_action", {"thought": "42"})))
    assert (r.done, r.reward) == (True, 1.0)  # AgentBench commits finish_action's thought
    session = episode(task, MATCH)
    assert session.interact(calls(("finish_action", {}))).reward == 0.0
    check = {"description": "d", "evaluation": {"check": {"language": "python", "code":
                                                          "import sys; sys.exit(sys.argv[1] != 'None')"}}}
    assert episode(task, check).interact(calls(("finish_action", {}))).reward == 1.0  # str(None), as AgentBench
    r = episode(task, MATCH).interact(calls(("bash_action", {})))
    assert (r.done, r.reward, r.status) == (True, 0.0, Status.INVALID_ACTION)  # AgentBench's task raises here


def test_failed_setup_ends_the_sample(task: OsTask) -> None:
    item = {"description": "d", "create": {"init": {"code": "exit 1"}}, "evaluation": {"check": {"code": "true"}}}
    r = episode(task, item).interact(calls(("finish_action", {"thought": "done"})))
    assert (r.done, r.reward, r.metrics["setup_failed"]) == (True, 0.0, 1.0)


def test_expert_on_dev_under_the_faithful_protocol(task: OsTask) -> None:
    solved = {i for i in task.indices("dev") if play(task, i)[0] == 1.0}
    # as under the strict protocol: dev-24 chowns to another user, which needs the ids a root worker maps
    unsolved = {"dev-8"} if task.sandbox.many_uids(task.backend) else {"dev-8", "dev-24"}
    assert set(task.indices("dev")) - solved == unsolved


def test_missing_checkout_files_say_what_is_missing(tmp_path: Path) -> None:
    checkout = agentbench_checkout(tmp_path)
    (checkout / "configs/tasks/os.yaml").unlink()
    with pytest.raises(FileNotFoundError, match=r"reads configs/tasks/os.yaml from the AgentBench checkout"):
        ab.load_prompts(checkout)
