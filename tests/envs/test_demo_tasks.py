"""The demo's tasks: unlock, and lookup's imperfect expert (expert_skill)."""
from __future__ import annotations

import pytest
from env_helpers import call

from agentrl.checks.contract import check_task
from agentrl.checks.expert import play
from agentrl.serving.session import Session
from agentrl.tasks import get_task, task_name
from agentrl.tasks.lookup import LookupTask, make_sample
from agentrl.tasks.unlock import UnlockTask, code_of
from agentrl.types import Status


def test_unlock_rewards_the_code_on_the_note() -> None:
    s = Session(UnlockTask(), "train-5")
    r = s.interact(call("read_note", {}))
    assert r.messages[0]["content"] == code_of("train-5") and not r.done
    r = s.interact(call("enter_code", {"code": f" {code_of('train-5')} "}))
    assert r.done and r.reward == 1.0 and r.status == Status.COMPLETED
    assert r.metrics == {"success": 1.0, "read_note": 1.0}


def test_unlock_a_wrong_code_ends_the_game_with_nothing() -> None:
    code = code_of("train-5")
    wrong = "red" if code != "red" else "blue"
    r = Session(UnlockTask(), "train-5").interact(call("enter_code", {"code": wrong}))
    assert r.done and r.reward == 0.0 and r.metrics == {"success": 0.0, "read_note": 0.0}


@pytest.mark.parametrize("cls", [LookupTask, UnlockTask])
def test_expert_skill_sets_the_experts_success_rate(cls: type) -> None:
    task = cls(expert_skill=0.5)
    indices = task.indices("train")[:400]
    wins = sum(play(task, i)[0] for i in indices) / len(indices)
    floor = 1 / 16 if cls is UnlockTask else 0.0  # unlock's guesses are right 1 time in 16
    assert 0.5 - 0.08 < wins - floor * 0.5 < 0.5 + 0.08
    assert all(play(cls(expert_skill=1.0), i)[0] == 1.0 for i in indices[:50])
    assert [play(task, i)[0] for i in indices[:30]] == [play(cls(expert_skill=0.5), i)[0] for i in indices[:30]]


def test_lookup_unskilled_expert_asks_for_another_field_of_the_right_item() -> None:
    task = LookupTask(expert_skill=0.0)
    s = Session(task, "train-7")
    first = s.expert_message()["tool_calls"][0]["function"]["arguments"]
    sample = make_sample("train-7")
    assert f'"name": "{sample.target}"' in first and f'"field": "{sample.field}"' not in first


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_expert_skill_out_of_range_fails_at_construction(bad: float) -> None:
    with pytest.raises(ValueError, match="expert_skill"):
        get_task("unlock", expert_skill=bad)
    with pytest.raises(ValueError, match="expert_skill"):
        get_task("lookup", expert_skill=bad)


def test_imperfect_experts_still_meet_the_contract_at_their_rate() -> None:
    report = check_task(UnlockTask(expert_skill=0.5), samples=40, min_success=0.3)
    assert 0.3 * 40 <= report.solved["train"] <= 0.8 * 40


def test_task_name_of_an_import_path_is_the_name_the_worker_serves() -> None:
    assert task_name("lookup") == "lookup"
    assert task_name("agentrl.tasks.example:GuessTask") == "guess"
    assert task_name("agentrl.tasks.unlock:UnlockTask") == "unlock"
    with pytest.raises(KeyError):
        task_name("no_such_task")
