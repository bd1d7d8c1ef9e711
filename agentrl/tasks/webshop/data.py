"""The `webshop` task's offline data: a synthetic product catalog and shopping instructions, fixed seed.

`generate(seed)` gives three files in WebShop's own formats, so that one loader reads ours and a
WebShop checkout's (`catalog.load_catalog`):

  * `items_shuffle.json`: products as WebShop scraped them (`asin`, `name`, `category`, `query`,
    `product_category`, `full_description`, `small_description`, `pricing` "$12.99" or
    "$10.00 - $14.00", `customization_options` {option: [{"value": ...}]}, `images`);
  * `items_ins_v2.json`: asin -> {"attributes": [...]} (WebShop's mined attributes);
  * `items_human_ins.json`: asin -> [{"instruction", "instruction_attributes", "instruction_options"}]
    (WebShop's human-written goals; ours come from templates).

The world: a few departments, each with product types, attributes that products of that type do or
do not have, and options (color, size, flavor, ...). Each type has several products that differ in
their attributes and options, so a search on the type alone is not enough: an instruction asks for
one product's attributes and one value of each of its options.
"""
from __future__ import annotations

import json
import random
from typing import Any

DEPARTMENTS: dict[str, dict[str, Any]] = {
    "beauty": {
        "types": ["shampoo", "conditioner", "face moisturizer", "lip balm", "hair dryer", "nail polish", "body lotion"],
        "attributes": ["sulfate free", "paraben free", "cruelty free", "long lasting", "travel size",
                       "natural ingredients", "sensitive skin", "fragrance free", "easy to use", "high quality"],
        "options": {"scent": ["lavender", "coconut", "vanilla", "rose", "unscented", "mint"],
                    "size": ["2 fl oz", "8 fl oz", "16 fl oz", "32 fl oz"]},
    },
    "electronics": {
        "types": ["wireless earbuds", "phone case", "usb cable", "bluetooth speaker", "power bank", "webcam",
                  "computer mouse"],
        "attributes": ["fast charging", "noise cancelling", "water resistant", "long battery life", "easy to install",
                       "high definition", "lightweight", "shockproof", "plug and play", "hands free"],
        "options": {"color": ["black", "white", "blue", "red", "silver", "rose gold"],
                    "size": ["3 ft", "6 ft", "10 ft", "small", "large"]},
    },
    "grocery": {
        "types": ["green tea", "protein bar", "coffee beans", "trail mix", "olive oil", "dark chocolate", "granola"],
        "attributes": ["gluten free", "sugar free", "non gmo", "low calorie", "keto friendly", "high protein",
                       "dairy free", "individually wrapped", "usda organic", "kosher certified"],
        "options": {"flavor": ["original", "peanut butter", "chocolate chip", "vanilla", "honey", "sea salt"],
                    "size": ["pack of 1", "pack of 6", "pack of 12", "12 ounce", "24 ounce"]},
    },
    "fashion": {
        "types": ["running shoes", "t-shirt", "hoodie", "yoga pants", "rain jacket", "wool socks", "baseball cap"],
        "attributes": ["machine washable", "slim fit", "moisture wicking", "non slip", "quick drying", "breathable",
                       "button closure", "elastic waist", "memory foam", "long sleeve"],
        "options": {"color": ["black", "navy", "grey", "white", "olive green", "burgundy"],
                    "size": ["small", "medium", "large", "x-large", "xx-large"]},
    },
    "home": {
        "types": ["throw pillow", "bath towel", "desk lamp", "wall clock", "storage basket", "shower curtain",
                  "bed sheet set"],
        "attributes": ["easy clean", "machine washable", "space saving", "eco friendly", "easy assembly",
                       "heavy duty", "non toxic", "super soft", "living room", "dining room"],
        "options": {"color": ["beige", "grey", "white", "teal", "charcoal", "mustard yellow"],
                    "size": ["18 x 18 inch", "20 x 20 inch", "twin", "queen", "king"]},
    },
}
BRANDS = ("Acme", "Northwind", "Bluebird", "Everpeak", "Lumen", "Orchard", "Kestrel", "Maple & Co", "Solstice",
          "Tidewater", "Vantage", "Willow", "Zephyr", "Cobalt", "Fernhill", "Halcyon")
DESCRIPTIONS = ("Designed for everyday use.", "A customer favorite.", "Backed by our satisfaction guarantee.",
                "Thoughtfully made and carefully tested.", "Great as a gift.")
PRODUCTS_PER_TYPE = 14


def _product(rng: random.Random, n: int, dept: str, spec: dict[str, Any], ptype: str) -> dict[str, Any]:
    attrs = rng.sample(spec["attributes"], rng.randint(2, 4))
    options: dict[str, list[str]] = {}
    for name in rng.sample(sorted(spec["options"]), rng.randint(1, 2)):
        options[name] = rng.sample(spec["options"][name], rng.randint(2, 4))
    brand = rng.choice(BRANDS)
    title = f"{brand} {ptype.title()} - {', '.join(a.title() for a in attrs[:2])}"
    low = round(rng.uniform(5, 90), 2)
    pricing = f"${low:.2f}" if rng.random() < 0.7 else f"${low:.2f} - ${low + rng.randint(2, 15):.2f}"
    return {
        "asin": f"B0{n:08d}", "name": title, "category": dept, "query": ptype,
        "product_category": f"{dept.title()} › {ptype.title()}",
        "full_description": f"{brand} {ptype}: {', '.join(attrs)}. {rng.choice(DESCRIPTIONS)}",
        "small_description": [a.capitalize() for a in attrs] + [f"Brand: {brand}"],
        "pricing": pricing,
        "customization_options": {k: [{"value": v, "image": None} for v in vs] for k, vs in options.items()},
        "images": [""],
        "_attributes": attrs,
    }


def _instruction(rng: random.Random, product: dict[str, Any]) -> dict[str, Any]:
    attrs = rng.sample(product["_attributes"], min(len(product["_attributes"]), rng.randint(1, 2)))
    options = [rng.choice([o["value"] for o in values]) for values in product["customization_options"].values()]
    want = rng.choice(["i need", "i'm looking for", "i want to buy", "find me", "i would like"])
    text = f"{want} {' and '.join(attrs)} {product['query']}"
    if options:
        text += " in " + ", ".join(options)
    return {"instruction": text, "instruction_attributes": attrs, "instruction_options": options}


def generate(seed: int = 0) -> dict[str, str]:
    """{file name: content} of the catalog and its instructions (the same bytes for the same seed)."""
    rng = random.Random(f"webshop:{seed}")
    products: list[dict[str, Any]] = []
    for dept, spec in DEPARTMENTS.items():
        for ptype in spec["types"]:
            for _ in range(PRODUCTS_PER_TYPE):
                products.append(_product(rng, len(products), dept, spec, ptype))
    rng.shuffle(products)  # WebShop's file is shuffled too ("items_shuffle")
    attributes = {p["asin"]: {"attributes": p.pop("_attributes")} for p in products}
    human = {}
    for p in products:
        goals = [_instruction(rng, {**p, "_attributes": attributes[p["asin"]]["attributes"]})
                 for _ in range(rng.choice((1, 1, 2)))]
        unique = {g["instruction"]: g for g in goals}  # two draws may coincide
        human[p["asin"]] = list(unique.values())

    def dump(obj: Any) -> str:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), sort_keys=True) + "\n"

    return {"items_shuffle.json": dump(products), "items_ins_v2.json": dump(attributes),
            "items_human_ins.json": dump(human)}
