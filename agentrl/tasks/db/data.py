"""The `db` task's own samples, in AgentBench's dbbench format, from a fixed seed.

`generate(split, n)` draws sample i of a split from `random.Random(f"db:{split}:{i}")` (so
`data/db/*.jsonl` is reproducible with `python -m jobs.make_task_data db`, and test samples are fresh
draws). Each sample is one small table from one of five domains and one question of AgentBench's types:
a lookup ("other"), counting, aggregation-SUM/AVG/MAX/MIN, ranking, comparison, INSERT, UPDATE, DELETE.

The gold SQL is written to mean the same on SQLite and on MySQL/MariaDB (backquoted names, quoted
literals, equality filters), and numbers in a column have a fixed number of digits, so that text and
numeric comparisons and MAX/MIN agree on both engines. Labels of SELECT-type samples are computed here
in Python; `answer_md5` of modifications is the table hash after the gold SQL on SQLite (the MariaDB
tests check that MariaDB gives the same hash).
"""
from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from agentrl.tasks.db.backends import SqliteDatabase, tables_of

SPLIT_SIZES = {"train": 500, "test": 100}

FIRST = ("Ada", "Bela", "Cyrus", "Dina", "Elio", "Fumi", "Gita", "Hugo", "Ines", "Jun", "Kofi", "Lena", "Mato",
         "Nia", "Oren", "Pia", "Quin", "Rosa", "Sami", "Tova", "Uma", "Vito", "Wren", "Yara", "Zane")
LAST = ("Abbot", "Bauer", "Costa", "Duarte", "Evans", "Fischer", "Garcia", "Hale", "Ivanov", "Jensen", "Kato",
        "Lopez", "Moreau", "Novak", "Okafor", "Petrov", "Quinn", "Rossi", "Silva", "Tanaka")
CITIES = ("Lisbon", "Oslo", "Quito", "Accra", "Hanoi", "Perth", "Lima", "Turin", "Kyoto", "Dakar", "Porto", "Riga")
COUNTRIES = ("Norway", "Peru", "Ghana", "Japan", "Chile", "Kenya", "Spain", "Nepal", "Italy", "Egypt", "Fiji")
WORDS = ("Silent", "Golden", "Hidden", "Broken", "Crimson", "Distant", "Frozen", "Gentle", "Hollow", "Iron",
         "Lonely", "Midnight", "Quiet", "Rapid", "Secret", "Wild")
NOUNS = ("River", "Garden", "Empire", "Voyage", "Harbor", "Signal", "Orchard", "Lantern", "Summit", "Canyon")

# Each domain: table name, key column (unique), text columns with their value pools, numeric columns
# with their (low, high) range of equal digit counts.
Domain = dict[str, Any]
DOMAINS: tuple[Domain, ...] = (
    {"table": "Employees", "key": "Name", "text": {"Department": ("Sales", "Research", "Support", "Finance", "Legal"),
                                                    "City": CITIES},
     "num": {"Salary": (30000, 99999), "Age": (21, 64)}, "key_kind": "person"},
    {"table": "Products", "key": "Product", "text": {"Category": ("Tools", "Garden", "Kitchen", "Toys", "Office")},
     "num": {"Price": (100, 999), "Stock": (10, 99)}, "key_kind": "product"},
    {"table": "Cities", "key": "City", "text": {"Country": COUNTRIES, "Region": ("North", "South", "East", "West")},
     "num": {"Population": (100000, 999999), "Area": (100, 999)}, "key_kind": "city"},
    {"table": "Books", "key": "Title", "text": {"Author": LAST, "Genre": ("Mystery", "Poetry", "History", "Fantasy")},
     "num": {"Year": (1900, 2023), "Pages": (100, 899)}, "key_kind": "title"},
    {"table": "Match Results", "key": "Team", "text": {"Venue": CITIES, "Coach": LAST},
     "num": {"Goals For": (10, 99), "Goals Against": (10, 99)}, "key_kind": "team"},
)


def _key(rng: random.Random, kind: str) -> str:
    if kind == "person":
        return f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    if kind == "product":
        return f"{rng.choice(WORDS)} {rng.choice(('Lamp', 'Kettle', 'Drill', 'Chair', 'Pen', 'Clock', 'Vase'))}"
    if kind == "city":
        return f"{rng.choice(('New', 'Port', 'Saint', 'Upper', 'Lower', 'East'))} {rng.choice(CITIES)}"
    if kind == "title":
        return f"The {rng.choice(WORDS)} {rng.choice(NOUNS)}"
    return f"{rng.choice(CITIES)} {rng.choice(('Rovers', 'United', 'Athletic', 'Wanderers', 'City', 'Stars'))}"


def _table(rng: random.Random, domain: Domain) -> tuple[list[str], list[list[str]]]:
    columns = [domain["key"], *domain["text"], *domain["num"]]
    keys: list[str] = []
    while len(keys) < rng.randint(8, 15):
        k = _key(rng, domain["key_kind"])
        if k not in keys:
            keys.append(k)
    rows = [[k, *(rng.choice(pool) for pool in domain["text"].values()),
             *(str(rng.randint(lo, hi)) for lo, hi in domain["num"].values())] for k in keys]
    return columns, rows


def _q(name: str) -> str:
    return f"`{name}`"


def _lit(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


Question = tuple[str, str, str, list[str]]  # (type, description, gold SQL, label)


def _lookup(rng: random.Random, d: Domain, cols: list[str], rows: list[list[str]]) -> Question:
    row = rng.choice(rows)
    ci = rng.randrange(1, len(cols))
    sql = f"SELECT {_q(cols[ci])} FROM {_q(d['table'])} WHERE {_q(cols[0])} = {_lit(row[0])}"
    return "other", f"What is the {cols[ci]} of {row[0]}?", sql, [row[ci]]


def _counting(rng: random.Random, d: Domain, cols: list[str], rows: list[list[str]]) -> Question:
    ci = rng.randrange(1, 1 + len(d["text"]))
    value = rng.choice(rows)[ci]
    n = sum(r[ci] == value for r in rows)
    sql = f"SELECT COUNT(*) FROM {_q(d['table'])} WHERE {_q(cols[ci])} = {_lit(value)}"
    return "counting", f"How many rows of the table have {cols[ci]} equal to {value}?", sql, [str(n)]


def _aggregate(rng: random.Random, d: Domain, cols: list[str], rows: list[list[str]]) -> Question:
    fn = rng.choice(("SUM", "AVG", "MAX", "MIN"))
    ni = rng.randrange(1 + len(d["text"]), len(cols))
    ci = rng.randrange(1, 1 + len(d["text"]))
    value = rng.choice(rows)[ci]
    nums = [int(r[ni]) for r in rows if r[ci] == value]
    result = {"SUM": sum(nums), "AVG": round(sum(nums) / len(nums), 4), "MAX": max(nums), "MIN": min(nums)}[fn]
    word = {"SUM": "total", "AVG": "average", "MAX": "largest", "MIN": "smallest"}[fn]
    sql = f"SELECT {fn}({_q(cols[ni])}) FROM {_q(d['table'])} WHERE {_q(cols[ci])} = {_lit(value)}"
    return f"aggregation-{fn}", f"What is the {word} {cols[ni]} among the rows whose {cols[ci]} is {value}?", sql, [
        str(result)]


def _ranking(rng: random.Random, d: Domain, cols: list[str], rows: list[list[str]]) -> Question:
    ni = rng.randrange(1 + len(d["text"]), len(cols))
    desc = rng.random() < 0.5
    ordered = sorted(rows, key=lambda r: int(r[ni]), reverse=desc)
    if len(ordered) > 1 and ordered[0][ni] == ordered[1][ni]:  # a tie has no single answer: use the other end
        desc = not desc
        ordered = sorted(rows, key=lambda r: int(r[ni]), reverse=desc)
    sql = (f"SELECT {_q(cols[0])} FROM {_q(d['table'])} ORDER BY {_q(cols[ni])} {'DESC' if desc else 'ASC'} "
           f"LIMIT 1")
    word = "highest" if desc else "lowest"
    return "ranking", f"Which {cols[0]} has the {word} {cols[ni]}?", sql, [ordered[0][0]]


def _comparison(rng: random.Random, d: Domain, cols: list[str], rows: list[list[str]]) -> Question:
    ni = rng.randrange(1 + len(d["text"]), len(cols))
    threshold = rng.choice(rows)[ni]
    names = [r[0] for r in rows if int(r[ni]) > int(threshold)] or [r[0] for r in rows if r[ni] == threshold]
    op = ">" if any(int(r[ni]) > int(threshold) for r in rows) else "="
    sql = f"SELECT {_q(cols[0])} FROM {_q(d['table'])} WHERE {_q(cols[ni])} {op} {_lit(threshold)}"
    word = "greater than" if op == ">" else "equal to"
    return "comparison", f"Which {cols[0]} values have a {cols[ni]} {word} {threshold}?", sql, names


def _insert(rng: random.Random, d: Domain, cols: list[str], rows: list[list[str]]) -> Question:
    while True:
        key = _key(rng, d["key_kind"])
        if key not in {r[0] for r in rows}:
            break
    values = [key, *(rng.choice(p) for p in d["text"].values()), *(str(rng.randint(lo, hi)) for lo, hi in
                                                                   d["num"].values())]
    parts = ", ".join(f"{v} for {c}" for c, v in zip(cols[1:], values[1:]))
    sql = (f"INSERT INTO {_q(d['table'])} ({', '.join(map(_q, cols))}) VALUES "
           f"({', '.join(map(_lit, values))})")
    return "INSERT", f"Add {key} to the table {d['table']} with {parts}.", sql, [sql]


def _update(rng: random.Random, d: Domain, cols: list[str], rows: list[list[str]]) -> Question:
    row = rng.choice(rows)
    ci = rng.randrange(1, len(cols))
    if ci <= len(d["text"]):
        pool = list(d["text"].values())[ci - 1]
        value = rng.choice([v for v in pool if v != row[ci]])
    else:
        lo, hi = list(d["num"].values())[ci - 1 - len(d["text"])]
        value = str(rng.randint(lo, hi))
    sql = f"UPDATE {_q(d['table'])} SET {_q(cols[ci])} = {_lit(value)} WHERE {_q(cols[0])} = {_lit(row[0])}"
    return "UPDATE", f"Change the {cols[ci]} of {row[0]} to {value}.", sql, [sql]


def _delete(rng: random.Random, d: Domain, cols: list[str], rows: list[list[str]]) -> Question:
    ci = rng.randrange(1, 1 + len(d["text"]))
    value = rng.choice(rows)[ci]
    sql = f"DELETE FROM {_q(d['table'])} WHERE {_q(cols[ci])} = {_lit(value)}"
    return "DELETE", f"Remove every row whose {cols[ci]} is {value} from the table {d['table']}.", sql, [sql]


QUESTIONS: tuple[Callable[..., Question], ...] = (_lookup, _counting, _aggregate, _ranking, _comparison, _insert,
                                                  _update, _delete)


def make_entry(rng: random.Random, kind_index: int) -> dict[str, Any]:
    domain = rng.choice(DOMAINS)
    cols, rows = _table(rng, domain)
    qtype, description, sql, label = QUESTIONS[kind_index % len(QUESTIONS)](rng, domain, cols, rows)
    entry: dict[str, Any] = {
        "description": description, "label": label, "type": [qtype],
        "table": {"table_name": domain["table"], "table_info": {
            "columns": [{"name": c, "type": "TEXT"} for c in cols], "rows": rows}},
        "add_description": f"The name of this table is {domain['table']}, and the headers of this table are "
                           f"{','.join(cols)}.",
        "source": "agentrl",
    }
    if qtype in ("INSERT", "UPDATE", "DELETE"):
        db = SqliteDatabase(tables_of(entry))
        try:
            db.execute(sql)
            entry["answer_md5"] = f"[('{db.table_hash(tables_of(entry))}',)]"
        finally:
            db.close()
    else:
        entry["sql"] = {"query": sql}
    return entry


def generate(split: str, n: int | None = None) -> list[dict[str, Any]]:
    """Samples 0..n-1 of `split` (default: its size in SPLIT_SIZES); question type i % 8 for balance."""
    count = SPLIT_SIZES[split] if n is None else n
    return [make_entry(random.Random(f"db:{split}:{i}"), i) for i in range(count)]
