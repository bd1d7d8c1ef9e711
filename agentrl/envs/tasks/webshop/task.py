"""`webshop`: AgentBench-FC's WebShop — find and buy the product an instruction asks for.

Tools and limit are AgentBench-FC's (configs-webshop.yaml): `search_action(keywords)` and
`click_action(value)`; at most 20 rounds. As there, only the first tool call of a message is acted
on (the others are answered with a note and do nothing), and each answer reads
"Action: search[...]\\n\\nObservation:\\n<page>\\n\\nAvailable Actions:\\n{'has_search_bar': ...,
'clickables': [...]}". The pages are WebShop's, as its text mode shows them ("[SEP]"-joined): the
search page, results (10 per page of the top 50, "Next >", "< Prev"), a product page (its options,
"Description", "Features", "Reviews", "Buy Now"), and the product's sub-pages. A click on a value that
is not clickable, or a search where there is no search bar, does nothing (WebShop's rule).

Reward (WebShop's, in [0, 1]), given when "Buy Now" ends the episode:
    (attributes matched + options matched + [price <= bound]) / (#attributes + #options + 1) * r_type
An attribute matches when some attribute of the product has a token-set similarity > 85 with it, or
it occurs in the title, bullet points or description; an option matches a chosen option the same way
(colors normalized first); r_type is 1.0 when the product's type matches the goal's (same search
query, two shared category levels, or > 20% of the goal title's words), 0.5 when none does but some
title words are shared, 0.1 below 10% and 0.0 with no shared word. Two differences from WebShop's
code: the similarity is difflib's ratio over WebShop's token-set construction (WebShop uses
Levenshtein through thefuzz), and title words are all non-stop-words (WebShop keeps spaCy's nouns).
Status "completed"; metrics {"score": reward, "success": 1.0 if reward == 1.0 else 0.0}.

Data: `source="ours"` (default) reads this project's catalog (`data/webshop/`, made by
`webshop_data.py`); `source="webshop"` reads a WebShop checkout's data folder (`webshop_dir` or
`AGENTRL_WEBSHOP_DIR`: items_shuffle[_1000].json, items_ins_v2[_1000].json, items_human_ins.json).
Goals are WebShop's human goals (an instruction per product, its attributes and options, a price
bound drawn as WebShop draws it, here from a per-goal seed), in WebShop's order (shuffled with seed
233). Splits: ours test = goals 0..99, train = the rest; WebShop's as AgentBench's configs: test =
0..199 (webshop-std), train = 1000..11999 (webshop-env_train).

`source="agentbench"` takes the goal ranges from an AgentBench checkout's configs and defaults to
`protocol="faithful"`: AgentBench-FC's loop and prompt, read from the checkout (`webshop_faithful`).

The scripted expert searches the instruction (without the price clause), pages through the results
to the goal's product, clicks each goal option, then "Buy Now".
"""
from __future__ import annotations

import copy
import math
import os
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any

from agentrl.envs.api import Action, EnvError, StepResult, tool_message
from agentrl.envs.protocol import resolve_protocol
from agentrl.envs.tasks.agentbench import Checkout
from agentrl.envs.tasks.shared import call_message, data_root, read_json
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

SEARCH_RETURN_N = 50
PRODUCT_WINDOW = 10
BUY, NEXT, PREV, BACK = "Buy Now", "Next >", "< Prev", "Back to Search"
SUBPAGES = ("Description", "Features", "Reviews")
GOAL_SEED = 233  # WebShop shuffles its goals with random.seed(233)
STOP_WORDS = frozenset("a an and the of for with in on to by from or at x pack oz fl inch ft".split())


@dataclass
class Product:
    asin: str
    title: str
    category: str
    query: str
    product_category: str
    description: str
    bullets: list[str]
    attributes: list[str]
    options: dict[str, list[str]]
    price_tag: str
    price: float  # the price paid (WebShop draws one inside a range, once per product)


@dataclass
class Goal:
    asin: str
    instruction: str  # without the price clause: what the expert searches
    attributes: list[str]
    options: list[str]
    price_upper: float

    @property
    def text(self) -> str:
        bound = f", and price lower than {self.price_upper:.2f} dollars" if self.price_upper < 1e6 else ""
        return self.instruction.strip(".") + bound


# ------------------------------------------------------------------------------------------ catalog

def _parse_pricing(pricing: Any) -> list[float]:
    if not pricing:
        return [100.0]
    if isinstance(pricing, list):
        return [float(p) for p in pricing[:2]]
    return [float(re.sub(r"[^\d.]", "", p)) for p in str(pricing).split("$")[1:] if re.sub(r"[^\d.]", "", p)][:2]


def _product(raw: dict[str, Any], attributes: dict[str, Any]) -> Product:
    pricing = _parse_pricing(raw.get("pricing")) or [100.0]
    price = pricing[0] if len(pricing) == 1 else random.Random(raw["asin"]).uniform(*pricing)
    tag = f"${pricing[0]}" if len(pricing) == 1 else f"${pricing[0]} to ${pricing[1]}"
    options: dict[str, list[str]] = {}
    for name, contents in (raw.get("customization_options") or {}).items():
        if contents:  # WebShop's normalization of option values
            options[name.lower()] = [c["value"].strip().replace("/", " | ").lower() for c in contents]
    small = raw.get("small_description") or []
    return Product(asin=raw["asin"], title=raw.get("name") or "", category=raw.get("category") or "",
                   query=(raw.get("query") or "").lower().strip(), product_category=raw.get("product_category") or "",
                   description=raw.get("full_description") or "",
                   bullets=small if isinstance(small, list) else [small],
                   attributes=list((attributes.get(raw["asin"]) or {}).get("attributes") or ["DUMMY_ATTR"]),
                   options=options, price_tag=tag, price=price)


def _price_upper(price: float, seed: str) -> float:
    """WebShop's bound: the larger of two of the four $10 steps above the price (none above $990)."""
    steps = [p for p in (10.0 * i for i in range(1, 100)) if p > price][:4]
    if len(steps) < 2:
        return 1e6
    return max(random.Random(seed).sample(steps, 2))


class Catalog:
    """Products, goals and a BM25 index over titles, descriptions, bullet points and options."""

    def __init__(self, products: list[Product], human: dict[str, list[dict[str, Any]]]) -> None:
        self.products = {p.asin: p for p in products}
        self.goals: list[Goal] = []
        for p in products:
            for k, ins in enumerate(human.get(p.asin) or []):
                if not ins.get("instruction_attributes"):
                    continue  # WebShop skips goals without attributes
                self.goals.append(Goal(asin=p.asin, instruction=ins["instruction"].strip(),
                                       attributes=list(ins["instruction_attributes"]),
                                       options=[str(o).lower() for o in ins.get("instruction_options") or []],
                                       price_upper=_price_upper(p.price, f"{p.asin}:{k}")))
        random.Random(GOAL_SEED).shuffle(self.goals)
        self._index()

    def _index(self) -> None:
        self.docs: list[tuple[str, Counter[str], int]] = []
        df: Counter[str] = Counter()
        for p in self.products.values():
            words = tokens(" ".join([p.title, p.description, " ".join(p.bullets), p.query,
                                     " ".join(v for vs in p.options.values() for v in vs)]))
            tf = Counter(words)
            self.docs.append((p.asin, tf, len(words)))
            df.update(tf.keys())
        n = len(self.docs)
        self.idf = {w: math.log(1 + (n - d + 0.5) / (d + 0.5)) for w, d in df.items()}
        self.avgdl = sum(d[2] for d in self.docs) / max(n, 1)

    def search(self, keywords: str, k1: float = 0.9, b: float = 0.4) -> list[Product]:
        """The top 50 products by BM25 (Lucene's default k1, b as WebShop's pyserini index uses)."""
        query = set(tokens(keywords))
        scored = []
        for asin, tf, length in self.docs:
            s = sum(self.idf[w] * tf[w] * (k1 + 1) / (tf[w] + k1 * (1 - b + b * length / self.avgdl))
                    for w in query if w in tf)
            if s > 0:
                scored.append((-s, asin))
        return [self.products[a] for _, a in sorted(scored)[:SEARCH_RETURN_N]]


def tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _pick(folder: Path, *names: str) -> Path:
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"webshop: none of {', '.join(names)} in {folder}")


def load_catalog(folder: Path) -> Catalog:
    """A catalog in WebShop's file formats (ours or a WebShop checkout's `data/` folder)."""
    raw = read_json(_pick(folder, "items_shuffle.json", "items_shuffle_1000.json"), "the webshop products")
    attributes = read_json(_pick(folder, "items_ins_v2.json", "items_ins_v2_1000.json"), "the webshop attributes")
    human = read_json(_pick(folder, "items_human_ins.json"), "the webshop instructions")
    seen: set[str] = set()
    products = []
    for item in raw:
        asin = str(item.get("asin", ""))
        if asin == "nan" or len(asin) > 10 or asin in seen:  # WebShop's filter
            continue
        seen.add(asin)
        products.append(_product(item, attributes))
    return Catalog(products, human)


# ------------------------------------------------------------------------------------------ reward

def _similarity(a: str, b: str) -> float:
    return 100.0 * SequenceMatcher(None, a, b).ratio()


def token_set_ratio(a: str, b: str) -> float:
    """0..100: how alike two strings are as sets of words (shared words count once, order ignored)."""
    x, y = set(tokens(a)), set(tokens(b))
    both = " ".join(sorted(x & y))
    only_x = (both + " " + " ".join(sorted(x - y))).strip()
    only_y = (both + " " + " ".join(sorted(y - x))).strip()
    if both and (not x - y or not y - x):
        return 100.0
    return max(_similarity(both, only_x), _similarity(both, only_y), _similarity(only_x, only_y))


COLOR_SYNONYMS = {"grey": "gray", "navy blue": "navy", "multicolor": "multi", "multi color": "multi"}


def normalize_color(value: str) -> str:
    v = value.lower().strip()
    for k, canon in COLOR_SYNONYMS.items():
        v = v.replace(k, canon)
    return v


def type_reward(product: Product, goal_product: Product) -> float:
    query_match = product.query == goal_product.query
    cats = {c.strip().lower() for c in product.product_category.split("›")}
    goal_cats = {c.strip().lower() for c in goal_product.product_category.split("›")}
    category_match = len(cats & goal_cats) >= 2
    desired = {w for w in tokens(goal_product.title) if w not in STOP_WORDS and not w.isdigit()}
    got = {w for w in tokens(product.title) if w not in STOP_WORDS and not w.isdigit()}
    title_score = len(desired & got) / len(desired) if desired else 0.2
    r = 1.0 if (query_match or category_match or title_score > 0.2) else 0.5
    if title_score < 0.1:
        r = 0.1
    if title_score == 0.0:
        r = 0.0
    return r


def reward(product: Product, goal: Goal, goal_product: Product,
           chosen: dict[str, str]) -> tuple[float, dict[str, float]]:
    """WebShop's score of buying `product` with options `chosen` for `goal` (see the module docstring)."""
    text = " ".join([product.title, " ".join(product.bullets), product.description]).lower()
    attrs = sum(any(token_set_ratio(p, g) > 85 for p in product.attributes) or g.lower() in text
                for g in goal.attributes)
    picked = [normalize_color(o) for o in chosen.values()]
    opts = sum(any(token_set_ratio(p, normalize_color(g)) > 85 for p in picked) for g in goal.options)
    price_ok = float(product.price <= goal.price_upper)
    r_type = type_reward(product, goal_product)
    total = (attrs + opts + price_ok) / (len(goal.attributes) + len(goal.options) + 1) * r_type
    return total, {"r_type": r_type, "attributes": float(attrs), "options": float(opts), "price": price_ok}


# ------------------------------------------------------------------------------------------ episode

@dataclass
class Page:
    kind: str  # search | results | item | Description | Features | Reviews | done
    keywords: str = ""
    number: int = 1
    results: list[str] = field(default_factory=list)
    asin: str = ""


class WebShopEpisode:
    def __init__(self, catalog: Catalog, goal: Goal) -> None:
        self.catalog = catalog
        self.goal = goal
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


class WebShopTask:
    """The `webshop` task.

    Args:
        source: "ours" (default, `data/webshop/`), "webshop" (a WebShop checkout's data folder), or
            "agentbench" (that data folder, with the goal ranges of an AgentBench checkout's
            `configs/tasks/webshop.yaml`: test = webshop-std, train = webshop-env_train).
        webshop_dir: WebShop's data folder (default `AGENTRL_WEBSHOP_DIR`), e.g. `WebShop/data`.
        agentbench_dir: an AgentBench checkout (default `AGENTRL_AGENTBENCH_DIR`).
        data_dir: this project's data folder (default `data/`).
        protocol: "faithful" (AgentBench-FC's loop and prompt read from the checkout, `webshop_faithful`;
            the default with source="agentbench") or "strict" (ours, the default otherwise).
    """

    name = "webshop"
    max_turns = MAX_ROUNDS
    blocking = False

    def __init__(self, source: str = "ours", webshop_dir: str | Path | None = None,
                 agentbench_dir: str | Path | None = None, data_dir: str | Path | None = None,
                 protocol: str | None = None) -> None:
        checkout = Checkout.find(agentbench_dir)
        self.protocol = resolve_protocol(protocol, source == "agentbench", self.name)
        self.faithful: Any = None  # webshop_faithful.FaithfulPrompts in the faithful protocol
        if self.protocol == "faithful":
            if checkout is None:
                raise ValueError("webshop: protocol='faithful' (the default with source='agentbench') reads "
                                 "AgentBench-FC's prompt from a checkout: give agentbench_dir or "
                                 "AGENTRL_AGENTBENCH_DIR")
            from agentrl.envs.tasks.webshop_faithful import FaithfulPrompts  # it subclasses WebShopEpisode

            self.faithful = FaithfulPrompts.read(checkout)
            self.max_turns = self.faithful.max_rounds
        if source == "ours":
            self.catalog = load_catalog((Path(data_dir) if data_dir else data_root()) / "webshop")
            n = len(self.catalog.goals)
            self.ranges = {"test": (0, min(100, n)), "train": (min(100, n), n)}
        elif source in ("webshop", "agentbench"):
            folder = webshop_dir or os.environ.get("AGENTRL_WEBSHOP_DIR", "").strip()
            if not folder:
                raise ValueError(f"webshop: source={source!r} needs webshop_dir or AGENTRL_WEBSHOP_DIR")
            self.catalog = load_catalog(Path(folder).expanduser())
            # a search scans every product in Python: milliseconds for WebShop's 1k-product files, far
            # longer for its full catalog, so the worker runs this task's calls in threads
            self.blocking = True
            n = len(self.catalog.goals)
            wanted = self.faithful.ranges if source == "agentbench" else {"test": (0, 200), "train": (1000, 12000)}
            self.ranges = {split: (min(lo, n), min(hi, n)) for split, (lo, hi) in wanted.items()}
        else:
            raise ValueError(f"webshop: unknown source {source!r} (ours | webshop | agentbench)")
        self.sizes = {split: hi - lo for split, (lo, hi) in self.ranges.items()}

    def tools(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.faithful.tools if self.faithful else TOOLS)

    def indices(self, split: str) -> list[str]:
        """Indices name the goal's position in WebShop's goal order: "test-0" .. and "train-<k>"."""
        if split not in self.ranges:
            raise EnvError("bad_request", f"webshop has no split {split!r} (splits: {', '.join(self.ranges)})")
        lo, hi = self.ranges[split]
        return [f"{split}-{i}" for i in range(lo, hi)]

    def start(self, index: str) -> WebShopEpisode:
        split, _, num = index.rpartition("-")
        if split in self.ranges and num.isdigit() and num == str(int(num)):
            lo, hi = self.ranges[split]
            if lo <= int(num) < hi:
                goal = self.catalog.goals[int(num)]
                if self.faithful is not None:
                    from agentrl.envs.tasks.webshop_faithful import FaithfulWebShopEpisode

                    return FaithfulWebShopEpisode(self.catalog, goal, self.faithful)
                return WebShopEpisode(self.catalog, goal)
        raise EnvError("bad_request", f"webshop has no sample {index!r}")


