"""`webshop` with an AgentBench checkout: its goal ranges from `configs/tasks/webshop.yaml`, and
AgentBench-FC's faithful protocol (prompt from the checkout, first call only, first value whatever the
key, its messages, no word after "Buy Now"); and `expert_report` counting only reward 1.0 as success."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from agentbench_checkout import PROMPTS, build_checkout

from agentrl.checks.expert_report import report_split
from agentrl.serving.session import Session
from agentrl.tasks.api import Action, StepResult
from agentrl.tasks.webshop import WebShopTask
from agentrl.tasks.webshop.faithful import BAD_CALL, NO_CALLS
from agentrl.types import Status

OUR_CATALOG = Path(__file__).resolve().parents[2] / "data" / "webshop"


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_checkout(tmp_path_factory.mktemp("agentbench"))


@pytest.fixture(scope="module")
def task(checkout: Path) -> WebShopTask:
    return WebShopTask(agentbench_dir=checkout, protocol="faithful")


def message(*calls: tuple[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"c{i}", "type": "function",
         "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
        for i, (name, args) in enumerate(calls)]}


def test_agentbench_source_reads_the_checkouts_ranges(checkout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = WebShopTask(source="agentbench", webshop_dir=OUR_CATALOG, agentbench_dir=checkout)
    assert t.protocol == "faithful" and t.ranges["test"] == (0, 200)  # webshop-std: start 0, end 200
    assert t.ranges["train"][0] == min(1000, len(t.catalog.goals))  # webshop-env_train starts at 1000
    monkeypatch.delenv("AGENTRL_AGENTBENCH_DIR", raising=False)
    with pytest.raises(ValueError, match="reads AgentBench-FC's prompt"):
        WebShopTask(source="agentbench", webshop_dir=OUR_CATALOG, agentbench_dir=None)


def test_agentbench_source_in_the_strict_protocol_keeps_the_checkouts_ranges(checkout: Path) -> None:
    """The ranges are the checkout's whatever the protocol (they were read with the faithful prompts, so
    protocol='strict' failed on a missing attribute)."""
    t = WebShopTask(source="agentbench", webshop_dir=OUR_CATALOG, agentbench_dir=checkout, protocol="strict")
    assert t.protocol == "strict" and t.faithful is None and t.ranges["test"] == (0, 200)
    assert Session(t, "test-0").messages[0]["content"] != PROMPTS["webshop"]  # our prompt, not the checkout's


def test_faithful_protocol(task: WebShopTask) -> None:
    s = Session(task, "test-0")
    assert s.messages[0] == {"role": "system", "content": PROMPTS["webshop"]}
    assert s.messages[1]["content"].startswith("The initial observation:\nWebShop [SEP] Instruction:")
    goal = s.episode.goal
    r = s.interact(message(("search_action", {"query": goal.instruction}), ("click_action", {"value": "next >"})))
    assert len(r.messages) == 1 and r.messages[0]["content"].startswith(f"Action: search[{goal.instruction}]")
    assert s.episode.page.kind == "results" and s.episode.page.number == 1  # the second call never ran
    shown = r.messages[0]["content"].split("\n\nObservation:\n")[1].split("\n\nAvailable Actions:")[0]
    r = s.interact(message(("open_page", {"value": "x"})))  # another tool: nothing, the observation again
    assert r.messages == [{"role": "user", "content": f"Observation:\n{shown}\n\nAvailable Actions:\n"
                                                      f"{s.episode.available()}"}]
    r = s.interact(message(("open_page", {})))  # the tool's name is read before its (missing) argument
    assert [m["content"][:12] for m in r.messages] == ["Observation:"]
    r = s.interact(message(("click_action", {})))
    assert [m["content"] for m in r.messages][0] == BAD_CALL
    r = s.interact(message(("click_action", "not json")))
    assert [m["content"] for m in r.messages][0] == BAD_CALL and r.messages[1]["content"].startswith("Observation:")
    r = s.interact({"role": "assistant", "content": "which one?"})
    assert r.messages[0]["content"].startswith(f"Observation:\n{NO_CALLS}\n\nAvailable Actions:\n")


def test_expert_buys_with_no_word_after(task: WebShopTask) -> None:
    for index in task.indices("test")[:5]:
        s = Session(task, index)
        while not (r := s.interact(s.expert_message())).done:
            pass
        assert (r.reward, r.status, r.messages) == (1.0, Status.COMPLETED, []), index


class PartialEpisode:
    """Ends at once with a partial reward, as a webshop purchase of a near-miss product does."""

    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "user", "content": "buy"}]

    def step(self, action: Action) -> StepResult:
        return StepResult([], done=True, reward=0.75, status=Status.COMPLETED)

    def expert_message(self) -> dict[str, Any]:
        return message(("buy", {}))


class PartialTask:
    name, max_turns = "partial", 3

    def tools(self) -> list[dict[str, Any]]:
        return [{"type": "function", "function": {"name": "buy", "parameters": {"type": "object"}}}]

    def indices(self, split: str) -> list[str]:
        return ["test-0", "test-1"]

    def start(self, index: str) -> PartialEpisode:
        return PartialEpisode()


def test_expert_report_counts_only_full_reward_as_success() -> None:
    r = report_split(PartialTask(), "test")  # type: ignore[arg-type]
    assert (r.solved, r.episodes, r.failed) == (0, 2, ["test-0", "test-1"])
