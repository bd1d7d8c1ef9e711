"""The `os` task: AgentBench-FC's interface, AgentBench's file format and evaluation, the expert on our
samples and on AgentBench's dev subset, malformed calls, timeouts, and the committed data."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from env_helpers import call
from os_fixtures import agentbench_checkout
from sandbox_helpers import require_sandbox

from agentrl.checks.expert import play
from agentrl.sandbox import PYTHON_PRELUDE, TRUSTED_PYTHON, CommandResult
from agentrl.serving.session import Session
from agentrl.tasks import get_task
from agentrl.tasks.os_task import OsEpisode, OsTask, format_output, parse_problem, script_argv
from agentrl.tasks.task_data import os_files
from agentrl.types import Status


@pytest.fixture(scope="module")
def task() -> OsTask:
    require_sandbox()
    return OsTask(sandbox={"backend": "bwrap", "command_timeout_s": 3.0})


def test_interface_is_agentbench_fc() -> None:
    tools = OsTask.__dict__  # class attributes, no sandbox needed
    assert tools["name"] == "os" and tools["max_turns"] == 8 and tools["blocking"] is True
    from agentrl.tasks.os_task import TOOLS

    assert [t["function"]["name"] for t in TOOLS] == ["bash_action", "finish_action", "answer_action"]
    params = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    assert params["bash_action"] == {"type": "object", "properties": {"script": {
        "type": "string", "description": "The bash script to be executed."}}, "required": ["script"],
        "additionalProperties": False}
    assert params["answer_action"]["required"] == ["answer"] and params["finish_action"]["required"] == ["thought"]
    assert all(p["additionalProperties"] is False for p in params.values())


def test_agentbench_items_parse_by_its_rules(tmp_path: Path) -> None:
    (tmp_path / "check").mkdir()
    (tmp_path / "check" / "m.py").write_text("print(1)")
    p = parse_problem({"description": "d", "create": {"local": "default", "init": "echo a"},
                       "start": "sleep 9 &", "evaluation": {"match": "42"}, "example": {"code": "echo 42"}}, tmp_path)
    assert p.init == [("bash", "echo a")] and p.start == ("bash", "sleep 9 &")
    assert p.match == {"answer": "42", "strip": True} and p.example == ("bash", "echo 42")
    p = parse_problem({"description": "d", "create": [None, {"file": "x"}],  # a non-object create: no init
                       "evaluation": {"check": [None, {"language": "python", "file": "check/m.py"}],
                                      "example": "ls"}}, tmp_path)
    assert p.init == [] and p.check == [None, ("python", "print(1)")] and p.example == ("bash", "ls")
    with pytest.raises(ValueError, match="match' or 'check"):
        parse_problem({"description": "d", "evaluation": {}}, None)
    assert script_argv(("bash", "echo"), ["a"]) == ["bash", "-c", "echo", "--", "a"]
    assert script_argv(("bash", "echo"), []) == ["bash", "-c", "echo"]
    assert script_argv(("python", "x"), ["a", "b"]) == [*TRUSTED_PYTHON, "-c", PYTHON_PRELUDE, "x", "a", "b"]
    with pytest.raises(ValueError, match="unsupported script language"):
        script_argv(("ruby", "x"), [])


def test_observation_format() -> None:
    assert format_output(CommandResult("", 0), 10) == "(no output)"
    long = format_output(CommandResult("x" * 900, 0), 10)
    assert long.startswith("x" * 780 + "\n[truncated") and "900 characters" in long and "x" * 781 not in long
    assert "did not finish within 10 s" in format_output(CommandResult("partial", None, timed_out=True), 10)


def test_expert_solves_our_samples_and_dev(task: OsTask) -> None:
    assert task.sizes == {"train": 300, "test": 60, "dev": 26}
    for index in task.indices("train")[:14] + task.indices("test")[:6]:  # every template once or more
        reward, status, turns = play(task, index)
        assert (reward, status) == (1.0, Status.COMPLETED) and turns <= 2, index
    dev = {i: play(task, i) for i in task.indices("dev")}
    failed = sorted(i for i, (reward, _, _) in dev.items() if reward != 1.0)
    # dev-8: `du -sh` prints "4.0K", which AgentBench's own size-match.py cannot parse (int("4.0")): a data
    # defect. dev-24: its init chowns to another user: it passes where the sandbox maps many ids (a root
    # worker); with bubblewrap's one uid its setup fails, ending the sample at the first action.
    if task.sandbox.many_uids(task.backend):
        assert failed == ["dev-8"], failed
        assert dev["dev-24"][:2] == (1.0, Status.COMPLETED)
    else:
        assert failed == ["dev-24", "dev-8"], failed
        assert dev["dev-24"][1:] == (Status.COMPLETED, 1)


def test_evaluation_match_regex_check(task: OsTask) -> None:
    ep = OsEpisode(parse_problem({"description": "d", "evaluation": {"match": "7"}}, None), task.sandbox)
    assert ep.judge(" 7\n") and not ep.judge("8") and not ep.judge(None)
    ep = OsEpisode(parse_problem({"description": "d", "evaluation": {"match": {"regex": "^a+$"}}}, None), task.sandbox)
    assert ep.judge("aaa") and not ep.judge("ab")
    item = {"description": "d", "create": {"init": {"code": "mkdir -p /root/q && touch /root/q/a /root/q/b"}},
            "evaluation": {"check": [None, {"language": "python", "code":
                                            "import sys; sys.exit(int(sys.argv[1]) != int(sys.argv[2]))"}],
                           "example": {"code": "ls /root/q | wc -l"}}}
    ep = OsEpisode(parse_problem(item, None), task.sandbox)
    try:
        assert ep.judge("2") and not ep.judge("3") and not ep.judge("two")
    finally:
        ep.close()
    state = {"description": "d", "evaluation": {"check": {"code": "[ -f /root/made ]"}}}
    session = Session(task, "train-0")
    session.episode = OsEpisode(parse_problem(state, None), task.sandbox)
    r = session.interact(call("finish_action", {"thought": "done"}))
    assert (r.done, r.reward) == (True, 0.0)
    session = Session(task, "train-0")
    session.episode = OsEpisode(parse_problem(state, None), task.sandbox)
    session.interact(call("bash_action", {"script": "touch /root/made"}))
    r = session.interact(call("finish_action", {"thought": "done"}, "c1"))
    assert (r.done, r.reward, r.status, r.metrics["success"]) == (True, 1.0, Status.COMPLETED, 1.0)


def test_shell_session_over_turns_and_limits(task: OsTask) -> None:
    session = Session(task, "test-1")
    r = session.interact(call("bash_action", {"script": "pwd; cd /tmp && V=5"}))
    assert r.messages[0]["content"] == "/root\n" and r.messages[0]["tool_call_id"] == "c0"
    r = session.interact(call("bash_action", {"script": "echo $V $(pwd)"}, "c1"))
    assert r.messages[0]["content"] == "5 /tmp\n"
    r = session.interact(call("bash_action", {"script": "sleep 30"}, "c2"))
    assert "did not finish within 3 s" in r.messages[0]["content"] and not r.done
    r = session.interact(call("bash_action", {"script": "echo ${V:-gone} $(pwd)"}, "c3"))
    assert r.messages[0]["content"] == "5 /tmp\n"  # a timeout stops the command, not the session
    for n in range(4, 8):
        r = session.interact(call("bash_action", {"script": "true"}, f"c{n}"))
    assert (r.done, r.status, r.reward, session.turns) == (True, Status.TURN_LIMIT, 0.0, 8)
    assert session.episode._shell is not None and session.episode._shell.closed  # closed when it ended
    assert task.budget.live == 0


def test_failed_setup_ends_the_sample(task: OsTask) -> None:
    """AgentBench stops a sample whose init fails; a bare finish_action must not pass its check."""
    item = {"description": "d", "create": {"init": {"code": "echo broken >&2; exit 3"}},
            "evaluation": {"check": {"code": "true"}}}
    session = Session(task, "train-0")
    session.episode = OsEpisode(parse_problem(item, None), task.sandbox, task.budget)
    r = session.interact(call("finish_action", {"thought": "done"}))
    assert (r.done, r.reward, r.status, r.metrics["setup_failed"]) == (True, 0.0, Status.COMPLETED, 1.0)
    assert "init script 1 of 1 failed (exit 3): broken" in r.messages[0]["content"]


def test_setup_output_and_working_directory(task: OsTask) -> None:
    """A start script's background output never lands in the agent's observations; stdout only to checks."""
    item = {"description": "d", "start": "(while true; do echo NOISE; sleep 0.05; done) &",
            "evaluation": {"check": [None, {"language": "python", "code":
                                            "import sys; sys.exit(sys.argv[2] != '/root\\n')"}],
                           "example": {"code": "pwd; find /proc/tty/driver -maxdepth 0 >/dev/null; echo err >&2"}}}
    session = Session(task, "train-0")
    session.episode = OsEpisode(parse_problem(item, None), task.sandbox, task.budget)
    for n in range(3):
        r = session.interact(call("bash_action", {"script": "sleep 0.1; echo quiet"}, f"c{n}"))
        assert r.messages[0]["content"] == "quiet\n"
    r = session.interact(call("answer_action", {"answer": "x"}, "c3"))
    assert (r.done, r.reward) == (True, 1.0)  # the example's stdout was exactly "/root\n"


@pytest.mark.parametrize("message, expected", [
    (call("bash_action", {"cmd": "ls"}), "Error: invalid arguments for bash_action: 'script' is a required property"),
    (call("bash_action", {"script": 5}), "Error: invalid arguments for bash_action at script"),
    (call("run_shell", {"script": "ls"}), "Error: unknown tool 'run_shell'"),
    ({"role": "assistant", "content": "ls", "tool_calls": [
        {"id": "c0", "type": "function", "function": {"name": "bash_action", "arguments": "{ls"}}]},
     "Error: arguments are not valid JSON"),
])
def test_malformed_calls_are_observations(task: OsTask, message: dict[str, Any], expected: str) -> None:
    session = Session(task, "train-3")
    r = session.interact(message)
    assert not r.done and r.messages[0]["content"].startswith(expected), r.messages
    assert session.episode._shell is None  # nothing ran: the sandbox was not even made


def test_registry_and_options(task: OsTask, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="source='agentbench' with protocol='faithful' needs agentbench_dir"):
        get_task("os", source="agentbench", sandbox={"backend": "bwrap"})
    with pytest.raises(ValueError, match="does not accept the options"):
        get_task("os", no_such_option=1)
    with pytest.raises(ValueError, match="unknown protocol"):
        OsTask(protocol="loose", sandbox={"backend": "bwrap"})
    with pytest.raises(ValueError, match=r"1000000 sandbox slots exceed this host's pids budget \(0.5 of pid_max"):
        OsTask(slots=10**6, sandbox={"backend": "bwrap"})
    checkout = agentbench_checkout(tmp_path)  # AgentBench's own layout
    t = OsTask(source="agentbench", agentbench_dir=checkout, protocol="strict", sandbox={"backend": "bwrap"})
    assert t.sizes == {"train": 1, "test": 4, "dev": 26}
    assert t.problems["train"][0].match == {"answer": "2", "strip": True}
    assert t.problems["test"][3].check == [None, ("python", "print(1)")]  # its scripts from scripts/2/
    (checkout / "data/os_interaction/train_0317/training.json").unlink()  # one split does not need another
    assert OsTask(source="agentbench", agentbench_dir=checkout, protocol="strict",
                  sandbox={"backend": "bwrap"}).sizes == {"test": 4, "dev": 26}


def test_committed_data_is_what_the_generator_makes() -> None:
    root = Path(__file__).resolve().parents[2] / "data"
    for rel, content in os_files().items():
        assert (root / rel).read_text() == content, rel


def test_one_action_per_message(task: OsTask) -> None:
    """The strict protocol ran every call of a message, multiplying the round limit (8) by the
    calls a message holds (16). The first call runs, as the prompt says and AgentBench-FC does; the others
    are answered and not run."""
    session = Session(task, "train-3")
    calls = [call("bash_action", {"script": f"touch /root/f{i}; echo {i}"}, f"c{i}")["tool_calls"][0] for i in range(3)]
    calls.append(call("answer_action", {"answer": "x"}, "c9")["tool_calls"][0])
    message = {"role": "assistant", "content": "", "tool_calls": calls}
    r = session.interact(message)
    assert not r.done and [m["tool_call_id"] for m in r.messages] == ["c0", "c1", "c2", "c9"]
    assert r.messages[0]["content"] == "0\n"
    assert all(m["content"].startswith("Error: only the first tool call") for m in r.messages[1:])
    r = session.interact(call("bash_action", {"script": "ls /root | grep '^f'"}, "c10"))
    assert r.messages[0]["content"] == "f0\n"
    session.close()
