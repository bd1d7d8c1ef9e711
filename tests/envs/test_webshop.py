"""The webshop task: AgentBench-FC's tools and limit, WebShop's pages and reward (hand-checked), WebShop's
file formats, malformed and unavailable actions, and the expert on our catalog."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentrl.serving.session import Session
from agentrl.tasks import get_task
from agentrl.tasks.api import EnvError
from agentrl.tasks.webshop import Goal, Product, WebShopTask, load_catalog, reward, token_set_ratio
from agentrl.types import Status


def call(name: str, value: str, *more: tuple[str, str]) -> dict[str, Any]:
    key = {"search_action": "keywords", "click_action": "value"}
    calls = [(name, value), *more]
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": json.dumps({key[n]: v})}}
        for i, (n, v) in enumerate(calls)]}


@pytest.fixture(scope="module")
def task() -> WebShopTask:
    return WebShopTask()


def test_tools_and_round_limit_are_agentbench_fc(task: WebShopTask) -> None:
    assert task.max_turns == 20
    assert [(t["function"]["name"], t["function"]["parameters"]["required"]) for t in task.tools()] == [
        ("search_action", ["keywords"]), ("click_action", ["value"])]
    assert task.tools()[1]["function"]["description"] == "Click a button or link with a specified value."
    assert all(t["function"]["parameters"]["additionalProperties"] is False for t in task.tools())


def test_expert_buys_the_right_product_on_our_catalog(task: WebShopTask) -> None:
    assert (len(task.indices("test")), len(task.indices("train"))) == (100, 563)
    for index in task.indices("test") + task.indices("train")[:100]:
        s = Session(task, index)
        while not (r := s.interact(s.expert_message())).done:
            pass
        assert (r.reward, r.status, r.metrics["success"]) == (1.0, Status.COMPLETED, 1.0), index
        assert s.turns <= 9
    assert isinstance(get_task("webshop"), WebShopTask)


def test_committed_data_is_what_the_generator_gives() -> None:
    from agentrl.tasks.task_data import webshop_files

    root = Path(__file__).resolve().parents[2]
    for rel, content in webshop_files().items():
        assert (root / "data" / rel).read_text() == content, rel


def product(**kw: Any) -> Product:
    base = dict(asin="B000000001", title="Acme Shampoo - Sulfate Free", category="beauty", query="shampoo",
                product_category="Beauty › Shampoo", description="A shampoo.", bullets=["Sulfate free"],
                attributes=["sulfate free"], options={"scent": ["lavender", "mint"], "size": ["8 fl oz"]},
                price_tag="$25.0", price=25.0)
    return Product(**{**base, **kw})


GOAL = Goal(asin="B000000001", instruction="i need a sulfate free and long lasting shampoo in lavender, 8 fl oz",
            attributes=["sulfate free", "long lasting"], options=["lavender", "8 fl oz"], price_upper=30.0)


def test_reward_by_hand() -> None:
    gp = product()
    # attributes 1 of 2 (long lasting is nowhere), options 1 of 2, price ok: (1 + 1 + 1) / (2 + 2 + 1)
    assert reward(gp, GOAL, gp, {"scent": "lavender"})[0] == pytest.approx(0.6)
    assert reward(gp, GOAL, gp, {"scent": "lavender", "size": "8 fl oz"})[0] == pytest.approx(0.8)
    pricey = product(price=35.0)
    assert reward(pricey, GOAL, gp, {"scent": "lavender"})[0] == pytest.approx(0.4)
    # "long lasting" in the description counts, as WebShop's fallback to title/bullets/description
    described = product(description="Long lasting and gentle.")
    assert reward(described, GOAL, gp, {"scent": "lavender", "size": "8 fl oz"})[0] == pytest.approx(1.0)
    # another type of product, no title word shared: r_type 0, whatever matched
    lamp = product(title="Zephyr Desk Lamp", query="desk lamp", product_category="Home › Desk Lamp")
    total, info = reward(lamp, GOAL, gp, {"scent": "lavender"})
    assert (total, info["r_type"]) == (0.0, 0.0)


def test_token_set_ratio() -> None:
    assert token_set_ratio("8 fl oz", "8 fl oz") == 100.0
    assert token_set_ratio("lavender", "lavender scent") == 100.0  # one a subset of the other
    assert token_set_ratio("fl oz 8", "8 fl oz") == 100.0  # order does not matter
    assert token_set_ratio("black", "blue") < 85 and token_set_ratio("navy blue", "navy") == 100.0


def test_pages_clicks_and_unavailable_actions(task: WebShopTask) -> None:
    s = Session(task, "test-0")
    goal = s.episode.goal
    assert s.messages[1]["content"].startswith("The initial observation:\nWebShop [SEP] Instruction: [SEP] ")
    assert s.messages[1]["content"].endswith("Available Actions:\n{'has_search_bar': True, 'clickables': ['search']}")
    r = s.interact(call("click_action", "buy now"))  # not on this page: nothing happens
    assert r.messages[0]["content"].startswith("Action: click[buy now]\n\nObservation:\nWebShop [SEP]") and not r.done
    r = s.interact(call("search_action", goal.instruction, ("click_action", "next >")))  # only the first runs
    assert "Page 1 (Total results: 50)" in r.messages[0]["content"]
    assert r.messages[1]["content"].startswith("Error: only the first tool call") and s.episode.page.number == 1
    r = s.interact(call("search_action", "anything"))  # no search bar on a results page
    assert "'has_search_bar': False" in r.messages[0]["content"] and s.episode.page.kind == "results"
    r = s.interact(call("click_action", "Next >"))  # clicks are case-insensitive, as WebShop lowercases them
    assert "Page 2 (Total results: 50)" in r.messages[0]["content"] and "'< prev'" in r.messages[0]["content"]
    r = s.interact(call("click_action", "< Prev"))
    asin = s.episode._shown()[0].asin
    r = s.interact(call("click_action", asin.lower()))
    page = r.messages[0]["content"]
    assert "[SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now" in page and "'buy now'" in page
    r = s.interact(call("click_action", "features"))
    assert s.episode.page.kind == "Features" and "'< prev'" in r.messages[0]["content"]
    s.interact(call("click_action", "< prev"))
    r = s.interact({"role": "assistant", "content": "hmm"})  # no tool call
    assert r.messages[0]["role"] == "user" and not r.done
    r = s.interact(call("click_action", "buy now"))
    assert r.done and r.status == Status.COMPLETED and 0.0 <= r.reward <= 1.0
    assert "Thank you for shopping with us!" in r.messages[0]["content"]
    assert r.metrics["score"] == r.reward


def test_turn_limit(task: WebShopTask) -> None:
    s = Session(task, "test-1")
    for _ in range(19):
        assert not s.interact(call("click_action", "nothing here")).done
    r = s.interact(call("click_action", "nothing here"))
    assert (r.done, r.reward, r.status) == (True, 0.0, Status.TURN_LIMIT)


def test_webshop_file_formats(tmp_path: Path) -> None:
    """A WebShop checkout's data folder: its names, "$a - $b" pricing, option normalization, filters."""
    items = [{"asin": "B0TEST0001", "name": "Rose Soap Bar", "category": "beauty", "query": "Soap ",
              "product_category": "Beauty › Soap", "full_description": "Soap.", "small_description": "Gentle",
              "pricing": "$10.00 - $14.00", "images": [""],
              "customization_options": {"Scent": [{"value": "Rose/Musk", "image": None}], "Size": None}},
             {"asin": "nan", "name": "broken"}, {"asin": "B0TEST0001", "name": "duplicate"}]
    (tmp_path / "items_shuffle_1000.json").write_text(json.dumps(items))
    (tmp_path / "items_ins_v2_1000.json").write_text(json.dumps({"B0TEST0001": {"attributes": ["gentle"]}}))
    (tmp_path / "items_human_ins.json").write_text(json.dumps({"B0TEST0001": [
        {"instruction": "i want a gentle rose soap.", "instruction_attributes": ["gentle"],
         "instruction_options": ["rose | musk"]},
        {"instruction": "no attributes: skipped", "instruction_attributes": [], "instruction_options": []}]}))
    catalog = load_catalog(tmp_path)
    [p] = catalog.products.values()
    assert (p.title, p.query, p.options, p.price_tag, p.bullets) == (
        "Rose Soap Bar", "soap", {"scent": ["rose | musk"]}, "$10.0 to $14.0", ["Gentle"])
    assert 10.0 <= p.price <= 14.0
    [goal] = catalog.goals
    assert goal.options == ["rose | musk"] and goal.price_upper in (20.0, 30.0, 40.0, 50.0)
    assert goal.text.startswith("i want a gentle rose soap, and price lower than ")
    t = WebShopTask(source="webshop", webshop_dir=tmp_path)
    assert t.indices("test") == ["test-0"] and t.indices("train") == []
    s = Session(t, "test-0")
    while not (r := s.interact(s.expert_message())).done:
        pass
    assert r.reward == 1.0
    with pytest.raises(EnvError):
        t.start("train-0")
    with pytest.raises(ValueError, match="webshop_dir"):
        WebShopTask(source="webshop")
