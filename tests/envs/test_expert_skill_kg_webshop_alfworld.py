"""`expert_skill` in the `kg`, `webshop` and `alfworld` tasks: at 1 the scripted expert plays as it always has;
below 1, on a fixed share of samples, it gives its final answer or action before it has what that needs, and
fails without an error: kg answers with a variable on the way, webshop buys the first result at once, alfworld
plays the walkthrough's last action first. The strict and the faithful protocol alike."""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from agentbench_checkout import build_checkout
from env_helpers import moves, transcript

from agentrl.checks.expert import play
from agentrl.config import ConfigError, load_config
from agentrl.tasks.kg import KGTask, parse_action
from agentrl.tasks.shared import expert_skilled
from agentrl.tasks.webshop import WebShopTask
from agentrl.types import Status

PROTOCOLS = ["strict", "faithful"]
Make = Callable[..., Any]


def near_half(wins: int, n: int) -> bool:
    """Within 3 standard deviations of Binomial(n, 1/2)'s mean."""
    return abs(wins - n / 2) <= 3 * math.sqrt(n) / 2


FAMILIES = ["kg", "webshop", "alfworld"]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_checkout(tmp_path_factory.mktemp("agentbench"))


@pytest.fixture(scope="module", autouse=True)
def games_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """alfworld unpacks its games into a fresh cache, as tests/envs/test_alfworld.py has it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGENTRL_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


def maker(name: str, protocol: str, checkout: Path) -> Make:
    """A family's task in a protocol (the faithful one reads the fixture checkout), given its expert_skill."""
    cls: Any
    if name == "alfworld":
        pytest.importorskip("textworld", reason="TextWorld is the envs extra (install.sh installs it)")
        from agentrl.tasks.alfworld import AlfworldTask
        cls = AlfworldTask
    else:
        cls = {"kg": KGTask, "webshop": WebShopTask}[name]
    given = {"agentbench_dir": checkout, "protocol": "faithful"} if protocol == "faithful" else {}
    return lambda **skill: cls(**given, **skill)


@pytest.fixture(params=[(f, p) for f in FAMILIES for p in PROTOCOLS], ids="-".join)
def family(request: pytest.FixtureRequest, checkout: Path) -> Make:
    return maker(*request.param, checkout)


@pytest.fixture(params=PROTOCOLS)
def kg(request: pytest.FixtureRequest, checkout: Path) -> Make:
    return maker("kg", request.param, checkout)


@pytest.fixture(params=PROTOCOLS)
def webshop(request: pytest.FixtureRequest, checkout: Path) -> Make:
    return maker("webshop", request.param, checkout)


@pytest.fixture(params=PROTOCOLS)
def alfworld(request: pytest.FixtureRequest, checkout: Path) -> Make:
    return maker("alfworld", request.param, checkout)


# ------------------------------------------------------------------------------------------- all three
def test_full_skill_plays_as_with_no_option(family: Make) -> None:
    plain, full = family(), family(expert_skill=1.0)
    for index in plain.indices("test")[:3]:
        messages, result = transcript(full, index)
        assert (messages, result) == transcript(plain, index), index
        assert (result.status, result.reward, result.metrics["success"]) == (Status.COMPLETED, 1.0, 1.0), index


def test_half_skill_fails_the_drawn_samples_and_draws_alike_again(family: Make) -> None:
    task = family(expert_skill=0.5)
    indices = task.indices("train")[:60] if task.name != "alfworld" else task.indices("train") + task.indices("test")
    outcomes = [play(task, i) for i in indices]
    wins = [reward == 1.0 for reward, _, _ in outcomes]
    assert wins == [expert_skilled(task.name, i, 0.5) for i in indices]
    assert 40 <= len(indices) and near_half(sum(wins), len(indices)), sum(wins)
    assert all(status != Status.INVALID_ACTION and status != Status.ENV_ERROR for _, status, _ in outcomes)
    assert [play(family(expert_skill=0.5), i) for i in indices] == outcomes


def test_a_negative_skill_fails_at_load_naming_the_field() -> None:
    for name in FAMILIES:
        with pytest.raises(ConfigError, match=rf"^envs\.task_options\.{name}\.expert_skill: must be in \[0, 1\]"):
            load_config("smoke", [f"envs.tasks=[{name}]", f"envs.task_options.{name}.expert_skill=-0.1"])


# ------------------------------------------------------------------------------------------------ kg
def test_kg_no_skill_answers_before_its_answer_is_made(kg: Make) -> None:
    """Multi-hop samples: a prefix of the skilled calls, ending on a variable that is not the answer. One-hop
    samples (test-0, test-1): as many calls, the hop along another relation of the question's entity."""
    task, skilled = kg(expert_skill=0.0), kg()
    for index in task.indices("test")[:6]:
        messages, result = transcript(task, index)
        assert (result.status, result.reward, result.metrics["success"]) == (Status.COMPLETED, 0.0, 0.0), index
        assert messages[-1]["role"] == "assistant" and messages[-1]["content"].startswith("Final Answer: #")
        mine, right = moves(messages), moves(transcript(skilled, index)[0])
        sample = task.split("test")[int(index.rpartition("-")[2])]
        if sum(parse_action(a)[0] not in ("get_relations", "get_attributes") for a in sample.actions) > 1:
            assert len(mine) < len(right) and mine == right[:len(mine)], index
        else:
            assert len(mine) == len(right) == 2 and mine[0] == right[0], index
            assert mine[1][1]["relation"] != right[1][1]["relation"], index


# ------------------------------------------------------------------------------------------- webshop
def test_webshop_no_skill_buys_the_first_result_at_once(webshop: Make) -> None:
    task, skilled = webshop(expert_skill=0.0), webshop()
    for index in task.indices("test")[:5]:
        messages, result = transcript(task, index)
        assert result.status == Status.COMPLETED and result.metrics["success"] == 0.0, index
        assert 0.0 < result.reward < 1.0 and result.metrics["r_options"] == 0.0, (index, result.metrics)
        mine, right = moves(messages), moves(transcript(skilled, index)[0])
        assert mine[0] == right[0] and len(mine) == 3 < len(right), index  # search, a result, "buy now"
        goal = task.catalog.goals[int(index.rpartition("-")[2])]
        first = task.catalog.search(goal.instruction)[0].asin.lower()
        assert mine[1:] == [("click_action", {"value": first}), ("click_action", {"value": "buy now"})], index


# ------------------------------------------------------------------------------------------ alfworld
def test_alfworld_no_skill_plays_the_last_action_first_and_never_wins(alfworld: Make) -> None:
    """No game of ours or ALFWorld's is lost and none can be given up: the failure runs to the round limit."""
    task, skilled = alfworld(expert_skill=0.0), alfworld()
    for index in task.indices("test")[:4]:
        messages, result = transcript(task, index)
        assert (result.status, result.reward, result.metrics["success"]) == (Status.TURN_LIMIT, 0.0, 0.0), index
        mine, right = moves(messages), moves(transcript(skilled, index)[0])
        assert mine == right[-1:] and len(right) > 1, index
        said = [m for m in messages if m["role"] == "assistant"]
        assert len(said) == task.max_turns and all(not m.get("tool_calls") for m in said[1:]), index
