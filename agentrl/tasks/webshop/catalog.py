"""The `webshop` catalog: products and goals in WebShop's file formats, and its BM25 search.

The same loader reads this project's catalog (`data/webshop/`) and a WebShop checkout's data folder.
"""
from __future__ import annotations

import math
import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.tasks.shared import read_json

SEARCH_RETURN_N = 50
GOAL_SEED = 233  # WebShop shuffles its goals with random.seed(233)


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
