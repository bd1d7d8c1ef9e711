"""The `db` task's samples: entries of an AgentBench dbbench file (ours are in the same format)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrl.tasks.db.backends import Table, tables_of
from agentrl.tasks.db.grading import MODIFY


class DbSample:
    """One entry of an AgentBench dbbench file, with what grading and the expert need."""

    def __init__(self, entry: dict[str, Any], ours: bool, sqlite_dir: Path | None = None) -> None:
        self.entry = entry
        self.ours = ours
        self.kind = str(entry["type"][0])
        self.tables: list[Table] = tables_of(entry)
        self.description = str(entry["description"])
        self.label = entry.get("label")
        self.answer_md5 = entry.get("answer_md5") if self.kind in MODIFY else None
        sql = entry.get("sql")
        gold = sql.get("query") if isinstance(sql, dict) else None
        if not gold and self.kind in MODIFY and isinstance(self.label, list) and self.label:
            gold = str(self.label[0])  # AgentBench's modification samples keep their SQL in `label`
        self.gold_sql: str | None = gold
        self.sqlite_file: Path | None = None
        if entry.get("user_sqlite"):
            if sqlite_dir is None:
                raise ValueError("a user_sqlite sample needs the checkout's db_train directory")
            self.sqlite_file = sqlite_dir / entry["create"]["database"] / entry["create"]["init"]

    def prompt(self) -> str:
        text = ""
        if self.entry.get("evidence"):
            text += f"Evidence about the question: {self.entry['evidence']}\n"
        if self.entry.get("add_description"):
            text += f"Additional table information about the question: {self.entry['add_description']}\n"
        return text + f"Question: {self.description}\n"


def load_samples(path: Path, ours: bool, sqlite_dir: Path | None = None) -> list[DbSample]:
    """All entries of a .jsonl (or .json list) dbbench file."""
    text = path.read_text(encoding="utf-8")
    entries = json.loads(text) if path.suffix == ".json" else [json.loads(x) for x in text.splitlines() if x.strip()]
    samples = []
    for n, entry in enumerate(entries):
        try:
            samples.append(DbSample(entry, ours, sqlite_dir))
        except (KeyError, TypeError, IndexError, ValueError) as e:
            raise ValueError(f"{path} entry {n}: not in AgentBench's dbbench format ({type(e).__name__}: {e})") from e
    return samples
