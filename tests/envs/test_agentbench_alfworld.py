"""`alfworld` on an AgentBench checkout's layout: AgentBench's split files at their real paths, and
AgentBench-FC's faithful protocol (prompt and tool from the checkout, first call only, first argument
whatever its key, BLEU snapping to an admissible action, the repeat rule), played on our games."""
from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agentbench_checkout import PROMPTS, build_checkout

from agentrl.serving.session import Session
from agentrl.types import Status

pytest.importorskip("textworld", reason="TextWorld is the envs extra (install.sh installs it)")

from agentrl.tasks.alfworld import AGENTBENCH_SPLITS, AlfworldTask  # noqa: E402
from agentrl.tasks.alfworld.faithful import BAD_CALL, NO_CALLS, bleu, process_action  # noqa: E402


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_checkout(tmp_path_factory.mktemp("agentbench"))


@pytest.fixture(scope="module")
def task(checkout: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AlfworldTask]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGENTRL_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield AlfworldTask(agentbench_dir=checkout, protocol="faithful")


def message(*calls: tuple[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"c{i}", "type": "function",
         "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
        for i, (name, args) in enumerate(calls)]}


def test_split_files_at_agentbench_paths(checkout: Path, tmp_path: Path) -> None:
    assert AGENTBENCH_SPLITS["test"] == "new_std.json" and AGENTBENCH_SPLITS["train"] == "train_valid.json"
    task = AlfworldTask(source="agentbench", alfworld_data=tmp_path, agentbench_dir=checkout)
    assert task.protocol == "faithful" and set(task.sizes) == {"dev", "test"} and task.sizes["test"] == 20
    assert task.games["test"][0].parts[-2:] == ("trial_T20190907_004404_604165", "game.tw-pddl")


def test_bleu_by_hand() -> None:
    assert bleu("go to desk 1", "go to desk 1") == 1.0
    assert bleu("go to desk 1", "take apple") == 0.0  # no word in common
    # "go to desk": precisions 3/3, 2/2, 1/1, and no 4-gram: smoothed to 1 / (2 * 5 / ln 3); brevity e^(1 - 4/3)
    expected = math.exp(1 - 4 / 3) * (math.log(3) / 10) ** 0.25
    assert bleu("go to desk 1", "go to desk") == pytest.approx(expected, rel=1e-12)
    choices = ["go to desk 1", "go to bed 1", "take apple 1 from desk 1"]
    assert process_action("Go To Desk 1\nand then look", choices) == "go to desk 1"
    assert process_action("walk to the bed 1", choices) == "go to bed 1"
    assert process_action("xyzzy", choices) == "xyzzy"  # nothing close: stays (and does nothing)


def test_prompt_and_tool_from_the_checkout(task: AlfworldTask) -> None:
    s = Session(task, "test-0")
    assert s.messages[0] == {"role": "system", "content": PROMPTS["alfworld"]}
    assert s.messages[1]["content"].startswith("Here is your task. ") and " AVAILABLE ACTIONS: " in s.messages[1][
        "content"]
    assert task.tools()[0]["function"]["name"] == "take_action" and task.max_turns == 20


def test_faithful_protocol(task: AlfworldTask) -> None:
    s = Session(task, "test-0")
    wanted = s.expert_message()["tool_calls"][0]["function"]
    action = json.loads(wanted["arguments"])["action"]
    # only the first call counts, by its first value whatever the key or the tool's name
    r = s.interact(message(("whatever", {"act": action.upper()}), ("take_action", {"action": "xyzzy"})))
    assert len(r.messages) == 1 and r.messages[0]["tool_call_id"] == "c0" and s.episode.moves == 1
    assert " AVAILABLE ACTIONS: " in r.messages[0]["content"]
    r = s.interact({"role": "assistant", "content": "hmm"})
    assert r.messages == [{"role": "user", "content": NO_CALLS}]
    r = s.interact(message(("take_action", "{broken")))
    assert r.messages == [{"role": "user", "content": BAD_CALL}]
    for n in range(3):  # the same raw action on moves 2, 3, 4: the fourth move ends the game
        r = s.interact(message(("take_action", {"action": "xyzzy"})))
        assert r.done is (n == 2)
    assert (r.reward, r.status) == (0.0, Status.INVALID_ACTION)


def test_expert_wins_under_the_faithful_protocol(task: AlfworldTask) -> None:
    for index in task.indices("test")[:4]:
        s = Session(task, index)
        while not (r := s.interact(s.expert_message())).done:
            pass
        assert (r.reward, r.status) == (1.0, Status.COMPLETED), index
