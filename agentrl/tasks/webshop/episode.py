"""One `webshop` episode in this project's protocol ("strict"): WebShop's pages in its text mode,
`search_action` / `click_action` until "Buy Now"; and the scripted expert."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentrl.tasks.api import Action, StepResult, tool_message
from agentrl.tasks.shared import call_message
from agentrl.tasks.webshop.catalog import Catalog, Goal, Product
from agentrl.tasks.webshop.reward import reward
from agentrl.types import Status

MAX_ROUNDS = 20
TOOLS: list[dict[str, Any]] = [  # configs-webshop.yaml of AgentBench-FC, unchanged
    {"type": "function", "function": {
        "name": "search_action", "description": "Use search functionality with specified keywords.",
        "parameters": {"type": "object", "properties": {
            "keywords": {"type": "string", "description": "The keywords to use in the search function."}},
            "required": ["keywords"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "click_action", "description": "Click a button or link with a specified value.",
        "parameters": {"type": "object", "properties": {
            "value": {"type": "string", "description": "The value to click from the list of available actions."}},
            "required": ["value"], "additionalProperties": False}}},
]
SYSTEM_PROMPT = """You are shopping on a web shop. Follow the instruction you are given.
Each round you get an observation of the current page and the actions available on it, and you respond
by calling one tool. Use search_action when the page has a search bar; use click_action with one of
the listed clickables. An action that is not available does nothing. Choose your search keywords
carefully. Think about what to do first, then call the tool; always call a tool."""


PRODUCT_WINDOW = 10
BUY, NEXT, PREV, BACK = "Buy Now", "Next >", "< Prev", "Back to Search"
SUBPAGES = ("Description", "Features", "Reviews")


@dataclass
class Page:
    kind: str  # search | results | item | Description | Features | Reviews | done
    keywords: str = ""
    number: int = 1
    results: list[str] = field(default_factory=list)
    asin: str = ""


class WebShopEpisode:
    def __init__(self, catalog: Catalog, goal: Goal, skilled: bool = True) -> None:
        self.catalog = catalog
        self.goal = goal
        self.skilled = skilled  # False: the expert buys without looking (`_hasty_message`)
        self.page = Page("search")
        self.chosen: dict[str, str] = {}
        self.moves = 0
        self._score: tuple[float, dict[str, float]] = (0.0, {})

    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": f"The initial observation:\n{self.observation()}\n\n"
                                            f"Available Actions:\n{self.available()}"}]

    # ------------------------------------------------------------------------------------ pages
    def _shown(self) -> list[Product]:
        lo = (self.page.number - 1) * PRODUCT_WINDOW
        return [self.catalog.products[a] for a in self.page.results[lo:lo + PRODUCT_WINDOW]]

    def observation(self) -> str:
        p = self.page
        head = ["Instruction:", self.goal.text]
        if p.kind == "search":
            return " [SEP] ".join(["WebShop", *head, "Search"])
        parts = [BACK, *head]
        if p.kind == "results":
            parts.append(f"Page {p.number} (Total results: {len(p.results)})")
            parts += [PREV] * (p.number > 1) + [NEXT] * (p.number * PRODUCT_WINDOW < len(p.results))
            for prod in self._shown():
                parts += [prod.asin, prod.title, prod.price_tag]
            return " [SEP] ".join(parts)
        prod = self.catalog.products[p.asin]
        parts.append(PREV)
        if p.kind == "item":
            for name, values in prod.options.items():
                parts += [name, *values]
            parts += [prod.title, f"Price: {prod.price_tag}", "Rating: N.A.", *SUBPAGES, BUY]
        elif p.kind == "Description":
            parts.append(prod.description)
        elif p.kind == "Features":
            parts += prod.bullets
        else:
            parts.append("No reviews yet.")
        return " [SEP] ".join(parts)

    def clickables(self) -> list[str]:
        p = self.page
        if p.kind == "search":
            return ["search"]
        out = [BACK.lower()]
        if p.kind == "results":
            out += [PREV.lower()] * (p.number > 1) + [NEXT.lower()] * (p.number * PRODUCT_WINDOW < len(p.results))
            out += [prod.asin.lower() for prod in self._shown()]
        elif p.kind == "item":
            out.append(PREV.lower())
            out += [v for values in self.catalog.products[p.asin].options.values() for v in values]
            out += [s.lower() for s in SUBPAGES] + [BUY.lower()]
        else:
            out.append(PREV.lower())
        return out

    def available(self) -> dict[str, Any]:
        return {"has_search_bar": self.page.kind == "search", "clickables": self.clickables()}

    # ------------------------------------------------------------------------------------ actions
    def step(self, action: Action) -> StepResult:
        first, rest = action.tool_calls[0], action.tool_calls[1:]
        arg = str(next(iter(first.arguments.values()))).strip()
        text = f"search[{arg}]" if first.name == "search_action" else f"click[{arg}]"
        result = self._act(first.name, arg)
        page = result or self.observation()
        messages = [tool_message(first.id, first.name,
                                 f"Action: {text}\n\nObservation:\n{page}\n\nAvailable Actions:\n{self.available()}")]
        messages += [tool_message(c.id, c.name, "Error: only the first tool call of a message is executed; "
                                                "this one was not.") for c in rest]
        self.moves += 1
        if self.page.kind != "done":
            return StepResult(messages=messages, metrics={"score": 0.0, "success": 0.0})
        score, info = self._score
        metrics = {"score": score, "success": float(score == 1.0), **{f"r_{k}": v for k, v in info.items()}}
        return StepResult(messages=messages, done=True, reward=score, status=Status.COMPLETED, metrics=metrics)

    def _act(self, name: str, arg: str) -> str | None:
        p = self.page
        if name == "search_action":
            if p.kind == "search" and arg:
                hits = self.catalog.search(arg)
                self.page = Page("results", keywords=arg, results=[h.asin for h in hits])
            return None
        value = arg.lower()
        if value not in self.clickables() or value == "search":
            return None  # WebShop: an action that is not available does nothing
        if value == BACK.lower():
            self.page, self.chosen = Page("search"), {}
        elif p.kind == "results" and value in (NEXT.lower(), PREV.lower()):
            self.page = Page("results", p.keywords, p.number + (1 if value == NEXT.lower() else -1), p.results)
        elif p.kind == "results":
            self.page = Page("item", p.keywords, p.number, p.results, asin=value.upper())
            self.chosen = {}
        elif p.kind == "item" and value == PREV.lower():
            self.page = Page("results", p.keywords, p.number, p.results)
        elif p.kind == "item" and value in [s.lower() for s in SUBPAGES]:
            self.page = Page(value.capitalize(), p.keywords, p.number, p.results, p.asin)
        elif p.kind == "item" and value == BUY.lower():
            product = self.catalog.products[p.asin]
            self._score = reward(product, self.goal, self.catalog.products[self.goal.asin], self.chosen)
            self.page = Page("done", asin=p.asin)
            return (f"Thank you for shopping with us! [SEP] Purchased [SEP] asin [SEP] {product.asin} [SEP] options "
                    f"[SEP] {self.chosen} [SEP] Your score (min 0.0, max 1.0) [SEP] {self._score[0]:.2f}")
        elif p.kind == "item":
            for option, values in self.catalog.products[p.asin].options.items():
                if value in values:
                    self.chosen[option] = value
                    break
        else:  # a sub-page: "< prev" goes back to the product
            self.page = Page("item", p.keywords, p.number, p.results, p.asin)
        return None

    # ------------------------------------------------------------------------------------ expert
    def expert_message(self) -> dict[str, Any]:
        """A function of the page: search, page to the goal's product, pick its options, buy."""
        if not self.skilled:
            return self._hasty_message()
        p, target = self.page, self.goal.asin.lower()
        if p.kind == "search":
            return call_message([("search_action", {"keywords": self.goal.instruction})], self.moves)
        clickable = self.clickables()
        if p.kind == "results":
            if target in clickable:
                value = target
            elif NEXT.lower() in clickable:
                value = NEXT.lower()
            else:  # not among the results: settle for the first one on this page
                value = next((c for c in clickable if c.upper() in self.catalog.products), BACK.lower())
            return call_message([("click_action", {"value": value})], self.moves)
        if p.kind == "item":
            options = self.catalog.products[p.asin].options
            for want in self.goal.options:
                for name, values in options.items():
                    if want in values and self.chosen.get(name) != want:
                        return call_message([("click_action", {"value": want})], self.moves)
            return call_message([("click_action", {"value": BUY.lower()})], self.moves)
        return call_message([("click_action", {"value": PREV.lower()})], self.moves)

    def _hasty_message(self) -> dict[str, Any]:
        """The unskilled expert, also a function of the page: the same search, then the first result bought at
        once, no option chosen, no page read. A goal that asks for an option is then never fully met; for one
        that asks for none, it passes over the results that would fully meet it, so that it never succeeds."""
        p = self.page
        if p.kind == "search":
            return call_message([("search_action", {"keywords": self.goal.instruction})], self.moves)
        if p.kind == "results":
            shown = self._shown()
            goal_product = self.catalog.products[self.goal.asin]
            pick = next((prod for prod in shown if reward(prod, self.goal, goal_product, {})[0] < 1.0),
                        shown[0] if shown else None)
            value = pick.asin.lower() if pick is not None else BACK.lower()
            return call_message([("click_action", {"value": value})], self.moves)
        if p.kind == "item":
            return call_message([("click_action", {"value": BUY.lower()})], self.moves)
        return call_message([("click_action", {"value": PREV.lower()})], self.moves)
