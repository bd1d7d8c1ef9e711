"""`expert_skill` in the `db` and `os` tasks: at 1 the scripted expert plays as it always has; below 1, on
a fixed share of samples, it gives its final answer at its first turn, before any query or command, and
that episode ends `completed` with nothing, in the strict and the faithful protocol alike."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from agentbench_checkout import build_checkout
from env_helpers import moves, transcript
from os_fixtures import agentbench_checkout
from sandbox_helpers import require_sandbox

from agentrl.checks.expert import play
from agentrl.config import ConfigError, load_config
from agentrl.serving.session import Session
from agentrl.tasks import get_task
from agentrl.tasks.db import MODIFY, DbEpisode, DbSample, DbTask
from agentrl.tasks.os_task import FaithfulOsEpisode, OsEpisode, OsTask, parse_problem
from agentrl.tasks.shared import expert_skilled
from agentrl.types import Status

SANDBOX = {"backend": "bwrap", "command_timeout_s": 3.0}
FINAL = {"commit_final_answer", "answer_action", "finish_action"}


def assert_answered_at_once(task: Any, index: str) -> tuple[str, dict[str, Any]]:
    """The unskilled expert's episode: one final call, no query or command before it, a completed failure."""
    messages, result = transcript(task, index)
    calls = moves(messages)
    assert len(calls) == 1 and calls[0][0] in FINAL, (index, calls)
    assert (result.done, result.status, result.reward, result.metrics["success"]) == (
        True, Status.COMPLETED, 0.0, 0.0), (index, result)
    return calls[0]


def kinds(task: DbTask, split: str) -> dict[str, str]:
    """The first index of each question type of a db split."""
    first: dict[str, str] = {}
    for index, sample in zip(task.indices(split), task.split(split)):
        first.setdefault(sample.kind, index)
    return first


# ------------------------------------------------------------------------------------------------ db
@pytest.fixture(scope="module")
def db_checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_checkout(tmp_path_factory.mktemp("agentbench"))


@pytest.fixture(scope="module", params=["strict", "faithful"])
def db_protocol(request: pytest.FixtureRequest, db_checkout: Path) -> tuple[dict[str, Any], str]:
    """A protocol's task options and the split it is tested on (the fixture checkout's test split is
    AgentBench's dev subset)."""
    if request.param == "strict":
        return {}, "train"
    return {"source": "agentbench", "agentbench_dir": db_checkout}, "test"


def test_db_full_skill_plays_as_with_no_option(db_protocol: tuple[dict[str, Any], str]) -> None:
    options, split = db_protocol
    plain, full = DbTask(**options), DbTask(**options, expert_skill=1.0)
    for index in kinds(plain, split).values():
        messages, result = transcript(full, index)
        assert (messages, result) == transcript(plain, index), index
        sample = plain.split(split)[int(index.rpartition("-")[2])]
        assert moves(messages)[0] == ("execute_sql", {"query": sample.gold_sql}), index
        if options == {} or sample.kind in MODIFY:  # AgentBench's SELECT golds do not all reproduce their labels
            assert result.reward == 1.0, index


def test_db_no_skill_commits_before_any_sql(db_protocol: tuple[dict[str, Any], str]) -> None:
    options, split = db_protocol
    task = DbTask(**options, expert_skill=0.0)
    picked = kinds(task, split)
    assert set(MODIFY) & set(picked), picked  # a change to commit without making it
    for kind, index in picked.items():
        name, args = assert_answered_at_once(task, index)
        assert name == "commit_final_answer", index
        if kind in MODIFY:
            assert args == {"answers": []}, index


def test_db_no_skill_fails_every_sample_of_our_splits() -> None:
    """Cheap (one commit each), so every sample: no guess the grader accepts, no gold change that leaves the table
    as it was."""
    task = DbTask(expert_skill=0.0)
    for split in ("train", "test", "dev"):
        outcomes = {i: play(task, i) for i in task.indices(split)}
        assert {i: o for i, o in outcomes.items() if o != (0.0, Status.COMPLETED, 1)} == {}, split


def test_db_half_skill_solves_about_half_and_the_rest_plays_as_before() -> None:
    task, full = DbTask(expert_skill=0.5), DbTask()
    indices = task.indices("train")[:60]
    rewards = [play(task, i)[0] for i in indices]
    assert abs(sum(rewards) - 30) <= 12  # |wins - n/2| within ~3 standard deviations of Binomial(60, 1/2)
    assert rewards == [float(expert_skilled("db", i, 0.5)) for i in indices]
    assert rewards == [play(DbTask(expert_skill=0.5), i)[0] for i in indices]  # fixed per sample
    skilled = [i for i in indices if expert_skilled("db", i, 0.5)]
    assert all(transcript(task, i) == transcript(full, i) for i in skilled[:20])


def test_db_a_guess_the_label_accepts_is_skipped() -> None:
    task = DbTask(expert_skill=0.0)
    index, sample = next((i, s) for i, s in zip(task.indices("test"), task.split("test")) if s.kind not in MODIFY)
    session = Session(task, index)
    session.episode.close()
    session.episode = DbEpisode(DbSample({**sample.entry, "label": []}, ours=True), task, skilled=False)
    move = session.expert_message()
    assert moves([move]) == [("commit_final_answer", {"answers": ["0"]})]  # [] would be right here
    r = session.interact(move)
    assert (r.done, r.status, r.reward) == (True, Status.COMPLETED, 0.0)


@pytest.mark.parametrize("task_name", ["db", "os"])
def test_expert_skill_out_of_range_fails_at_load(task_name: str) -> None:
    with pytest.raises(ConfigError, match=rf"^envs\.task_options\.{task_name}\.expert_skill: must be in \[0, 1\]"):
        load_config("smoke", [f"envs.tasks=[{task_name}]", f"envs.task_options.{task_name}.expert_skill=1.5"])
    with pytest.raises(ValueError, match="expert_skill must be in"):  # and at construction, before any sandbox
        get_task(task_name, expert_skill=1.5)


# ------------------------------------------------------------------------------------------------ os
OUR_KINDS = {"train-0": "answer check", "train-1": "match", "train-10": "state check", "train-12": "state check"}
"""Samples of each evaluation form among our templates (sample i is template i % 14)."""


@pytest.fixture(scope="module")
def os_checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return agentbench_checkout(tmp_path_factory.mktemp("agentbench-os"))


def os_kind(task: OsTask, index: str) -> str:
    split, _, i = index.rpartition("-")
    p = task.problems[split][int(i)]
    return "match" if p.match is not None else "answer check" if p.check and None in p.check else "state check"


def os_samples(task: OsTask) -> list[str]:
    """Samples of every evaluation form: ours, or the first two of each form in the faithful checkout's dev."""
    if task.protocol == "strict":
        return list(OUR_KINDS)
    picked: dict[str, list[str]] = {}
    for index in task.indices("dev"):
        picked.setdefault(os_kind(task, index), []).append(index)
    assert set(picked) == {"match", "answer check", "state check"}, picked
    return [i for found in picked.values() for i in found[:2]]


@pytest.fixture(scope="module", params=["strict", "faithful"])
def os_protocol(request: pytest.FixtureRequest, os_checkout: Path) -> dict[str, Any]:
    require_sandbox()
    if request.param == "strict":
        return {"sandbox": SANDBOX}
    return {"sandbox": SANDBOX, "source": "agentbench", "agentbench_dir": os_checkout}


def test_os_full_skill_plays_as_with_no_option(os_protocol: dict[str, Any]) -> None:
    plain, full = OsTask(**os_protocol), OsTask(**os_protocol, expert_skill=1.0)
    for index in os_samples(plain):
        messages, result = transcript(full, index)
        assert (messages, result) == transcript(plain, index), index
        split, _, i = index.rpartition("-")
        assert result.reward == 1.0, index
        if plain.problems[split][int(i)].example is not None:  # the skilled expert looks before it answers
            assert moves(messages)[0][0] == "bash_action", index


def test_os_no_skill_answers_before_any_command(os_protocol: dict[str, Any]) -> None:
    task = OsTask(**os_protocol, expert_skill=0.0)
    for index in os_samples(task):
        name, _ = assert_answered_at_once(task, index)
        assert name == ("finish_action" if os_kind(task, index) == "state check" else "answer_action"), index


def test_os_half_skill_solves_about_half() -> None:
    require_sandbox()
    task = OsTask(sandbox=SANDBOX, expert_skill=0.5)
    indices = task.indices("train")[:40]
    rewards = [play(task, i)[0] for i in indices]
    assert abs(sum(rewards) - 20) <= 10  # within ~3 standard deviations of Binomial(40, 1/2)
    assert rewards == [float(expert_skilled("os", i, 0.5)) for i in indices]
    again = OsTask(sandbox=SANDBOX, expert_skill=0.5)  # a fresh instance: each sample plays the same way
    assert [play(again, i)[0] for i in indices[:12]] == rewards[:12]


SAME_TEXT = "import sys; sys.exit(sys.argv[1].strip() != sys.argv[2].strip())"


@pytest.mark.parametrize("item", [
    {"description": "d", "evaluation": {"match": ""}},
    {"description": "d", "evaluation": {"check": [None, {"language": "python", "code": SAME_TEXT}],
                                        "example": {"code": "true"}}},  # the example prints nothing
])
def test_os_a_guess_equal_to_the_answer_is_skipped(os_protocol: dict[str, Any], item: dict[str, Any]) -> None:
    """An empty guess would be right on both; in the faithful protocol the example runs only at grading."""
    task = OsTask(**os_protocol)
    problem = parse_problem(item, None)
    session = Session(task, "dev-0")
    session.episode = (FaithfulOsEpisode(problem, task.sandbox, task.prompts, task.budget, skilled=False)
                       if task.prompts else OsEpisode(problem, task.sandbox, task.budget, skilled=False))
    move = session.expert_message()
    assert moves([move]) == [("answer_action", {"answer": "0"})]
    r = session.interact(move)
    assert (r.done, r.status, r.reward) == (True, Status.COMPLETED, 0.0)
