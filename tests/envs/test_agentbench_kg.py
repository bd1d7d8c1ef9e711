"""`kg` on an AgentBench checkout's layout: AgentBench's paths, one split without the others, and
AgentBench-FC's faithful protocol (prompts, one-shot example and tools read from the checkout; every
call runs; arguments by name, unchecked; its messages; its final answer), here over our local graph."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from agentbench_checkout import KG_ONE_SHOT, PROMPTS, build_checkout
from env_helpers import expert_reward

from agentrl.serving.session import Session
from agentrl.tasks.kg import AGENTBENCH_FILES, KGTask
from agentrl.tasks.kg.faithful import NO_CALLS
from agentrl.types import Status


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_checkout(tmp_path_factory.mktemp("agentbench"))


@pytest.fixture(scope="module")
def task(checkout: Path) -> KGTask:
    return KGTask(source="ours", agentbench_dir=checkout, protocol="faithful")


def message(*calls: tuple[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"c{i}", "type": "function",
         "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
        for i, (name, args) in enumerate(calls)]}


def test_agentbench_paths_and_one_split_alone(checkout: Path) -> None:
    assert AGENTBENCH_FILES == {"train": "data/knowledgegraph/kg_rl_all.json",
                                "test": "data/knowledgegraph/std.json", "dev": "data/knowledgegraph/dev.json"}
    task = KGTask(source="agentbench", agentbench_dir=checkout, sparql_url="http://127.0.0.1:9/sparql")
    assert task.protocol == "faithful" and len(task.indices("test")) == 20  # no kg_rl_all.json needed
    with pytest.raises(FileNotFoundError, match="kg_rl_all.json, which this AgentBench checkout does not have"):
        task.indices("train")


def test_prompts_and_one_shot_come_from_the_checkout(task: KGTask) -> None:
    test = Session(task, "test-0").messages
    assert test[0] == {"role": "system", "content": PROMPTS["kg"].format(max_round=15)}
    assert test[1:-1] == KG_ONE_SHOT  # kg-std has one_shot: true in configs/tasks/kg.yaml
    train = Session(task, "train-0").messages
    assert len(train) == 2 and train[1]["content"].endswith("]")  # kg-env_train: no one-shot


def test_faithful_calls(task: KGTask) -> None:
    s = Session(task, "test-0")
    entity = next(iter(s.episode.sample.entities))
    r = s.interact(message(("get_relations", {"variable": entity}), ("get_relations", {"entity": entity}),
                           ("get_neighbors", {"variable": "#7", "relation": "x"}), ("fly", {}),
                           ("count", "{oops")))
    contents = [m["content"] for m in r.messages]
    assert contents[0].startswith("Observation: [") and len(contents) == 5
    assert contents[1] == "Arguments do not match the function signature. Error processing arguments for get_relations"
    assert contents[2].startswith("Error processing tool call: #7 is not a variable")
    assert contents[3] == "Provide an invalid function name. Function fly does not exist"
    assert contents[4].startswith("Error processing tool call: arguments are not JSON")
    r = s.interact({"role": "assistant", "content": "I think so."})
    assert r.messages == [{"role": "user", "content": NO_CALLS}] and not r.done
    r = s.interact({"role": "assistant", "content": "Final Answer: #3"})  # no such variable: ends, no reward
    assert (r.done, r.reward, r.status, r.messages) == (True, 0.0, Status.INVALID_ACTION, [])


def test_expert_solves_under_the_faithful_protocol(task: KGTask) -> None:
    assert sum(expert_reward(task, f"test-{i}") for i in range(10)) == 10
