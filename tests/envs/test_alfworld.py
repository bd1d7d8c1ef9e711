"""The alfworld task: AgentBench-FC's tool and limit, our TextWorld games won by the expert, invalid and
malformed actions, AgentBench's split files, and the error when TextWorld is missing."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrl.serving.session import Session
from agentrl.tasks.api import EnvError
from agentrl.tasks.shared import import_optional

pytest.importorskip("textworld", reason="TextWorld is the envs extra (install.sh installs it)")

from agentrl.tasks.alfworld import AlfworldTask, clean, load_split  # noqa: E402
from agentrl.types import Status  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def act(action: Any, call_id: str = "c1") -> dict[str, Any]:
    args = action if isinstance(action, str) and action.startswith("{") else json.dumps({"action": action})
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": "take_action", "arguments": args}}]}


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AlfworldTask]:
    """The task, its games unpacked into a fresh cache (the first-use path)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGENTRL_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield AlfworldTask()


def play(task: AlfworldTask, index: str) -> tuple[Any, int]:
    s = Session(task, index)
    while not (r := s.interact(s.expert_message())).done:
        pass
    return r, s.turns


def test_tool_and_round_limit_are_agentbench_fc(task: AlfworldTask) -> None:
    assert task.max_turns == 20
    [tool] = task.tools()
    assert tool["function"]["name"] == "take_action" and tool["function"]["description"] == "Take an action."
    assert tool["function"]["parameters"] == {"type": "object", "properties": {"action": {
        "type": "string", "description": "The action you would like to take"}}, "required": ["action"],
        "additionalProperties": False}


def test_expert_wins_our_games(task: AlfworldTask) -> None:
    assert (len(task.indices("train")), len(task.indices("test"))) == (40, 10)
    for index in task.indices("test") + task.indices("train")[:2]:
        r, turns = play(task, index)
        assert (r.reward, r.status, r.metrics["success"]) == (1.0, Status.COMPLETED, 1.0), index
        assert turns <= 12


def test_episodes_in_threads(task: AlfworldTask) -> None:
    """The worker runs this blocking task in threads; TextWorld itself is not thread-safe."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: play(task, i)[0].reward, task.indices("test")[:8]))
    assert results == [1.0] * 8


@pytest.mark.slow
def test_expert_wins_every_train_game(task: AlfworldTask) -> None:
    assert all(play(task, i)[0].reward == 1.0 for i in task.indices("train"))


def test_a_game_from_start_to_win(task: AlfworldTask) -> None:
    s = Session(task, "test-0")
    first = s.messages[1]["content"]
    assert first.startswith("Here is your task. -= ") and "\n\nYour task is to: " in first
    assert "\n AVAILABLE ACTIONS: " in first and "look" in first.split("AVAILABLE ACTIONS: ")[1].split("\n")
    r = s.interact(act("dance wildly"))  # not admissible: nothing happens, the game does not move
    assert r.messages[0]["content"].startswith("Nothing happens.\n AVAILABLE ACTIONS: ") and not r.done
    r = s.interact(act('{"verb": "look"}'))  # fails the schema
    assert r.messages[0]["content"].startswith("Error: invalid arguments for take_action")
    r = s.interact({"role": "assistant", "content": "I look around."})  # no tool call
    assert r.messages[0]["role"] == "user" and not r.done
    walkthrough = list(s.episode.state.policy_commands)
    for k, step in enumerate(walkthrough):
        r = s.interact(act("  " + step.upper() + " "))  # case and spacing do not matter
        assert r.done == (k == len(walkthrough) - 1)
    assert (r.reward, r.status) == (1.0, Status.COMPLETED)
    assert "AVAILABLE ACTIONS" not in r.messages[0]["content"] and "RESTART" not in r.messages[0]["content"]


def test_turn_limit(task: AlfworldTask) -> None:
    s = Session(task, "test-1")
    for _ in range(19):
        assert not s.interact(act("inventory")).done
    r = s.interact(act("inventory"))
    assert (r.done, r.reward, r.status) == (True, 0.0, Status.TURN_LIMIT)


def test_clean_strips_textworld_furniture() -> None:
    raw = ("\nYou put the teacup on the chair.\n\n\nYour score has just gone up by one point.\n\n\n"
           "                    *** The End ***\n\nYou scored 1 out of a possible 1, in 4 turns.\n\n\n"
           "Would you like to RESTART, RESTORE a saved game, QUIT or UNDO the last command?\n> ")
    assert clean(raw) == "You put the teacup on the chair."
    assert clean("\nYou open it.\n\n\n>     -= Dish-Pit =-0/2") == "You open it."


def test_agentbench_split_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    games = load_split(ROOT / "data/agentbench/alfworld/dev.json", tmp_path)
    assert len(games) == 20 and games[0] == tmp_path / ("json_2.1.1/valid_unseen/pick_and_place_simple-SoapBottle-"
                                                          "None-Toilet-424/trial_T20190907_004404_604165/game.tw-pddl")
    task = AlfworldTask(source="alfworld", alfworld_data=tmp_path)
    assert task.indices("dev")[-1] == "dev-19"
    with pytest.raises(EnvError) as e:  # the game files are ALFWorld's data, not here
        task.start("dev-0")
    assert e.value.code == "env_error" and "game.tw-pddl" in e.value.message
    (tmp_path / "bad.json").write_text(json.dumps(["a", "b"]))
    with pytest.raises(ValueError, match="task type"):
        load_split(tmp_path / "bad.json", tmp_path)
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    with pytest.raises(ValueError, match="ALFWORLD_DATA"):
        AlfworldTask(source="alfworld")


def test_missing_dependency_names_the_install() -> None:
    with pytest.raises(ImportError, match=r"task 'alfworld' needs the 'no_such_textworld' package; install it with"):
        import_optional("no_such_textworld", "pip install -e '.[envs]'", "alfworld")


def test_one_move_per_message(task: AlfworldTask) -> None:
    """Strict alfworld played every call of a message, so a message holding the whole
    walkthrough won the game in one round (a blind policy sending 16 moves a message won 0.30 of the games,
    0.07-0.09 with one). The first call is the move, as in AgentBench-FC; the others are answered, not played."""
    s = Session(task, "test-0")
    walkthrough = list(s.episode.state.policy_commands)[:16]
    assert len(walkthrough) >= 2
    message = {"role": "assistant", "content": "", "tool_calls": [act(a, f"c{i}")["tool_calls"][0]
                                                                  for i, a in enumerate(walkthrough)]}
    r = s.interact(message)
    assert (r.done, r.reward) == (False, 0.0) and s.episode.moves == 1
    assert [m["tool_call_id"] for m in r.messages] == [f"c{i}" for i in range(len(walkthrough))]
    assert all(m["content"].startswith("Error: only the first tool call") for m in r.messages[1:])
    assert list(s.episode.state.policy_commands)[0] == walkthrough[1]  # the first move was played, only it
