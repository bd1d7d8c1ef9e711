"""The `kg` task's samples: questions in AgentBench's KG format (ours are in the same format)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.tasks.shared import read_json


@dataclass
class KGSample:
    question: str
    entities: dict[str, str]  # name -> id
    answer: set[str]
    actions: list[str] = field(default_factory=list)
    qid: str = ""

    @classmethod
    def from_agentbench(cls, item: dict[str, Any]) -> KGSample:
        return cls(question=item["question"], entities=dict(item.get("entities") or {}),
                   answer={str(a["answer_argument"]) for a in item["answer"]},
                   actions=list(item.get("actions") or []), qid=str(item.get("qid", "")))


def load_samples(path: Path) -> list[KGSample]:
    """Samples of an AgentBench-format KG file (a JSON list of questions)."""
    items = read_json(path, "kg samples")
    if not isinstance(items, list):
        raise ValueError(f"{path}: expected a JSON list of questions")
    try:
        return [KGSample.from_agentbench(item) for item in items]
    except (KeyError, TypeError) as e:
        raise ValueError(f"{path}: not in AgentBench's KG format ({type(e).__name__}: {e})") from e

