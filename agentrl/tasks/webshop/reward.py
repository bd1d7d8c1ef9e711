"""WebShop's reward for a purchase, rewritten (formula and the two differences: the `task` docstring).

Pure functions of a product, the goal and the options chosen.
"""
from __future__ import annotations

from difflib import SequenceMatcher

from agentrl.tasks.webshop.catalog import Goal, Product, tokens

STOP_WORDS = frozenset("a an and the of for with in on to by from or at x pack oz fl inch ft".split())


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
