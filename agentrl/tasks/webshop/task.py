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
`data.py`); `source="webshop"` reads a WebShop checkout's data folder (`webshop_dir` or
`AGENTRL_WEBSHOP_DIR`: items_shuffle[_1000].json, items_ins_v2[_1000].json, items_human_ins.json).
Goals are WebShop's human goals (an instruction per product, its attributes and options, a price
bound drawn as WebShop draws it, here from a per-goal seed), in WebShop's order (shuffled with seed
233). Splits: ours test = goals 0..99, train = the rest; WebShop's as AgentBench's configs: test =
0..199 (webshop-std), train = 1000..11999 (webshop-env_train).

`source="agentbench"` takes the goal ranges from an AgentBench checkout's configs and defaults to
`protocol="faithful"`: AgentBench-FC's loop and prompt, read from the checkout (`faithful`).

The scripted expert searches the instruction (without the price clause), pages through the results
to the goal's product, clicks each goal option, then "Buy Now". With `expert_skill` below 1, on a fixed
share (1 - skill) of goals (`shared.expert_skilled`) it buys without looking: the first result, at
once, no option chosen (`WebShopEpisode._hasty_message`); status "completed", success 0, and the
reward WebShop's partial credit for what that product happens to match (its attributes, price, type).
"""
from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

from agentrl.tasks.agentbench import AgentBenchPrompts, Checkout
from agentrl.tasks.api import EnvError
from agentrl.tasks.options import WebShopOptions
from agentrl.tasks.protocol import resolve_protocol
from agentrl.tasks.shared import checked_skill, data_root, expert_skilled
from agentrl.tasks.webshop.catalog import load_catalog
from agentrl.tasks.webshop.episode import MAX_ROUNDS, TOOLS, WebShopEpisode
from agentrl.tasks.webshop.faithful import PROMPTS, FaithfulWebShopEpisode, goal_ranges


class WebShopTask:
    """The `webshop` task.

    Args:
        source: "ours" (default, `data/webshop/`), "webshop" (a WebShop checkout's data folder), or
            "agentbench" (that data folder, with the goal ranges of an AgentBench checkout's
            `configs/tasks/webshop.yaml`: test = webshop-std, train = webshop-env_train).
        webshop_dir: WebShop's data folder (default `AGENTRL_WEBSHOP_DIR`), e.g. `WebShop/data`.
        agentbench_dir: an AgentBench checkout (default `AGENTRL_AGENTBENCH_DIR`).
        data_dir: this project's data folder (default `data/`).
        protocol: "faithful" (AgentBench-FC's loop and prompt read from the checkout, `faithful`;
            the default with source="agentbench") or "strict" (ours, the default otherwise).
    """

    name = "webshop"
    Options = WebShopOptions  # what `envs.task_options.webshop` may hold, checked at load
    max_turns = MAX_ROUNDS
    blocking = False

    def __init__(self, source: str = "ours", webshop_dir: str | Path | None = None,
                 agentbench_dir: str | Path | None = None, data_dir: str | Path | None = None,
                 protocol: str | None = None, expert_skill: float = 1.0) -> None:
        self.expert_skill = checked_skill("webshop", expert_skill)
        checkout = Checkout.find(agentbench_dir)
        self.protocol = resolve_protocol(protocol, source == "agentbench", self.name)
        self.faithful: AgentBenchPrompts | None = None  # read from the checkout in the faithful protocol
        if self.protocol == "faithful":
            if checkout is None:
                raise ValueError("webshop: protocol='faithful' (the default with source='agentbench') reads "
                                 "AgentBench-FC's prompt from a checkout: give agentbench_dir or "
                                 "AGENTRL_AGENTBENCH_DIR")
            self.faithful = AgentBenchPrompts.read(checkout, PROMPTS)
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
            if source == "agentbench" and checkout is None:
                raise ValueError("webshop: source='agentbench' reads its goal ranges from a checkout: give "
                                 "agentbench_dir or AGENTRL_AGENTBENCH_DIR")
            wanted = goal_ranges(checkout) if checkout is not None and source == "agentbench" else {
                "test": (0, 200), "train": (1000, 12000)}
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
                skilled = expert_skilled(self.name, index, self.expert_skill)
                if self.faithful is not None:
                    return FaithfulWebShopEpisode(self.catalog, goal, self.faithful, skilled)
                return WebShopEpisode(self.catalog, goal, skilled)
        raise EnvError("bad_request", f"webshop has no sample {index!r}")


