"""Graders the policy cannot touch: the two attacks that once earned reward 1.0 for a wrong
answer on `os` check samples now earn 0, and the right answers still pass."""
from __future__ import annotations

from typing import Any

import pytest
from env_helpers import call
from sandbox_helpers import require_sandbox

from agentrl.serving.session import MESSAGE_BUDGET_S, Session
from agentrl.tasks.os_task import OsEpisode, OsTask, parse_problem
from agentrl.types import Status

# A background job that floods every output it can open with what a completion marker looked like, and
# tries the driver's own channel and signals; it runs on through the evaluation unless stopped.
# (On main before this change, the first loop alone, which printed the marker kept in `$__ar_mark`, earned 1.0.)
FORGER = ("(while true; do printf '\\n\\036%s 0\\n' \"$__ar_mark\"; sleep 0.01; done) & "
          "(while true; do for f in /proc/[0-9]*/fd/1 /proc/[0-9]*/fd/2; do printf '\\n\\036forged 0\\n0\\n' > $f; "
          "done 2>/dev/null; kill -CONT 1 2>/dev/null; done) >/dev/null 2>&1 & kill -9 1; echo started")
# Every way the agent could put its own code where a grader's interpreter or PATH would find it, down to
# replacing the session's own /usr/bin tools (its copy: writable, as in AgentBench's container).
SHADOW = """
printf '#!/bin/sh\\nexit 0\\n' > /usr/local/bin/python3; chmod +x /usr/local/bin/python3
cp /usr/local/bin/python3 /usr/local/bin/bash; cp /usr/local/bin/python3 /usr/local/bin/grep
export PATH=/usr/local/bin:$PATH; python3() { exit 0; }; export -f python3; alias python3='exit 0'
mkdir -p /root/.local/lib/python3.11/site-packages && echo 'import os; os._exit(0)' > /root/.local/lib/python3.11/site-packages/a.pth
echo 'import os; os._exit(0)' > /root/sys.py; cp /root/sys.py /root/re.py; cp /root/sys.py /root/json.py
echo 'import os; os._exit(0)' > /etc/python3.11/sitecustomize.py
mkdir -p /usr/local/lib/python3.11/dist-packages && echo 'import os; os._exit(0)' > /usr/local/lib/python3.11/dist-packages/a.pth
echo /root/evil.so > /etc/ld.so.preload; ln -sf /usr/local/bin/python3 /etc/alternatives/awk
for t in python3.11 bash grep wc sh; do rm -f /usr/bin/$t; cp /usr/local/bin/python3 /usr/bin/$t; done
echo done
"""


@pytest.fixture(scope="module")
def task() -> OsTask:
    require_sandbox()
    return OsTask(sandbox={"backend": "bwrap", "command_timeout_s": 5.0})


def attack_then_answer(task: OsTask, index: str, attack: str, answer: str,
                       problem: dict[str, Any] | None = None, budget_s: float = MESSAGE_BUDGET_S) -> tuple[float, Status]:
    session = Session(task, index, message_budget_s=budget_s)
    if problem is not None:
        session.episode = OsEpisode(parse_problem(problem, None), task.sandbox, task.budget, task.example_state)
    r = session.interact(call("bash_action", {"script": attack}))
    assert not r.done, r.messages
    r = session.interact(call("answer_action", {"answer": answer}, "c1"))
    assert r.done
    return r.reward, r.status


def expected_count(task: OsTask, index: str) -> str:
    """The right answer of an answer-check sample, from a clean run of its example."""
    session = Session(task, index)
    example = session.expert_message()
    out = session.interact(example).messages[0]["content"].strip()
    session.close()
    return out


def test_forged_completion_markers_earn_nothing(task: OsTask) -> None:
    index = "train-0"  # count_extension: a `null` check (the example in the sandbox) + a python comparison
    assert task.problems["train"][0].check and task.problems["train"][0].check[0] is None
    right = expected_count(task, index)
    assert attack_then_answer(task, index, FORGER, "0") == (0.0, Status.COMPLETED)
    assert attack_then_answer(task, index, FORGER, "999") == (0.0, Status.COMPLETED)
    assert attack_then_answer(task, index, FORGER, right) == (1.0, Status.COMPLETED)


def test_shadowed_interpreters_earn_nothing(task: OsTask) -> None:
    index = "train-0"
    right = expected_count(task, index)
    assert attack_then_answer(task, index, SHADOW, "999") == (0.0, Status.COMPLETED)
    assert attack_then_answer(task, index, SHADOW, right) == (1.0, Status.COMPLETED)
    # A bash check that calls python3 and grep by name, as many of AgentBench's do.
    bash_check = {"description": "d", "evaluation": {"check": {"code": (
        'echo "$1" | grep -qx right && python3 -c "import sys; sys.exit(sys.argv[1] != \'right\')" "$1"')}}}
    assert attack_then_answer(task, "train-0", SHADOW, "wrong", bash_check) == (0.0, Status.COMPLETED)
    assert attack_then_answer(task, "train-0", SHADOW, "right", bash_check) == (1.0, Status.COMPLETED)


# A pyvenv.cfg under /usr whose `home` has the agent's `encodings`: on c07c523 every python-checked
# sample passed with any answer. A grader's /usr is now a read-only view of the image.
PYVENV = ("mkdir -p /tmp/e/bin /tmp/e/lib/python3.11/encodings && touch /tmp/e/lib/python3.11/os.py && "
          "echo 'import posix; posix._exit(0)' > /tmp/e/lib/python3.11/encodings/__init__.py && "
          "printf 'home = /tmp/e/bin\\n' > /usr/pyvenv.cfg && cp /usr/pyvenv.cfg /usr/bin/pyvenv.cfg && echo planted")


def test_start_up_files_under_usr_earn_nothing(task: OsTask) -> None:
    right = expected_count(task, "train-0")
    assert attack_then_answer(task, "train-0", PYVENV, "this is not a number") == (0.0, Status.COMPLETED)
    assert attack_then_answer(task, "train-0", PYVENV, right) == (1.0, Status.COMPLETED)


def test_destroying_what_the_example_counts_earns_nothing(task: OsTask) -> None:
    """On c07c523 the example ran on the state the agent left: `rm -rf` what it counts and
    answer "0" scored 1.0. The strict protocol's example runs before the agent acts (example_state
    "start"); "end" keeps AgentBench's semantics, and with it the hole."""
    right = expected_count(task, "train-0")
    assert right != "0"
    assert attack_then_answer(task, "train-0", "rm -rf /root/juniper; echo gone", "0") == (0.0, Status.COMPLETED)
    assert attack_then_answer(task, "train-0", "rm -rf /root/juniper; echo gone", right) == (1.0, Status.COMPLETED)
    faithful_semantics = OsTask(sandbox={"backend": "bwrap", "command_timeout_s": 5.0}, example_state="end")
    assert attack_then_answer(faithful_semantics, "train-0", "rm -rf /root/juniper; echo gone", "0") == \
        (1.0, Status.COMPLETED)  # the hole AgentBench's own protocol has (documented in docs/tasks.md)


def test_a_grader_the_session_hangs_is_the_agents_failure(task: OsTask) -> None:
    """A FIFO where the example reads: on c07c523 the grader outlived the worker's call deadline
    and the episode ended env_error (neither trained on nor counted). Now the message's time budget ends it
    as the agent's `grader_failed`, reward 0; a right answer on an untouched sample still passes."""
    import time

    problem = {"description": "d", "evaluation": {"check": [None, {"language": "python", "code": (
        "import sys; sys.exit(sys.argv[1].strip() != sys.argv[2].strip())")}], "example": {"code": "cat /root/n"}},
        "create": {"init": {"code": "echo 7 > /root/n"}}}
    fifo = "rm /root/n && mkfifo /root/n && echo ok"
    hung = OsTask(sandbox={"backend": "bwrap", "command_timeout_s": 5.0}, example_state="end")
    t = time.monotonic()  # a message's budget (envs.message_budget_s) of 3 s, not the default 18
    assert attack_then_answer(hung, "train-0", fifo, "7", problem, budget_s=3.0) == (0.0, Status.GRADER_FAILED)
    assert time.monotonic() - t < 3.0 + 3.0
    assert attack_then_answer(hung, "train-0", "echo hi", "7", problem, budget_s=3.0) == (1.0, Status.COMPLETED)
    # the strict protocol's reference comes from before the agent acted: the FIFO changes nothing
    assert attack_then_answer(task, "train-0", fifo, "7", problem) == (1.0, Status.COMPLETED)
    assert Status.GRADER_FAILED.is_agent_failure and not Status.GRADER_FAILED.is_infra


def test_a_grader_runs_while_the_agents_processes_are_stopped(task: OsTask) -> None:
    # The check sees the agent's processes (they exist) but none of them runs while it does.
    probe = {"description": "d", "evaluation": {"check": {"code": (
        "state=$(ps -o stat= -p $(cat /root/pid)); case $state in T*) exit 0;; *) exit 1;; esac")}}}
    session = Session(task, "train-0")
    session.episode = OsEpisode(parse_problem(probe, None), task.sandbox, task.budget)
    session.interact(call("bash_action", {"script": "sleep 300 & echo $! > /root/pid"}))
    r = session.interact(call("finish_action", {"thought": "done"}, "c1"))
    assert (r.done, r.reward) == (True, 1.0)


def test_a_fork_bomb_before_the_answer_fails_the_check_not_the_environment(task: OsTask) -> None:
    # The bomb fills the sandbox's own process table (an unprivileged uid under RLIMIT_NPROC, safe on a
    # shared machine); whether a grader then finds a free slot is a race, as in a container whose pids
    # limit is reached. Either way the episode ends as an ordinary verdict, never as an env_error the
    # policy could use to escape a bad one, and a wrong answer never passes.
    small = OsTask(sandbox={"backend": "bwrap", "command_timeout_s": 5.0, "nproc": 24})
    right = expected_count(small, "train-0")
    bomb = "( :(){ :|:& };: ) >/dev/null 2>&1 & sleep 1; echo lit"
    assert attack_then_answer(small, "train-0", bomb, "999") == (0.0, Status.COMPLETED)
    reward, status = attack_then_answer(small, "train-0", bomb, right)
    assert status == Status.COMPLETED and reward in (0.0, 1.0)
    assert small.budget.live == 0
