"""The built-in tasks' own data files, made deterministically (fixed seeds) by each task's generator.

Each generator returns {path relative to the data root: file content}; the files are committed under
`data/`, and making them again gives them byte for byte (the tests check it). A task adds itself to
`GENERATORS`. `jobs/make_task_data.py` is the command line that writes or checks them.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path


def os_files() -> dict[str, str]:
    from agentrl.tasks.os_task import data as os_data

    return {f"os/{split}.json": json.dumps(os_data.generate(split), indent=1) + "\n" for split in os_data.SPLIT_SIZES}


def db_files() -> dict[str, str]:
    from agentrl.tasks.db import data as db_data

    return {f"db/{split}.jsonl": "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in db_data.generate(split))
            for split in db_data.SPLIT_SIZES}


def kg_files() -> dict[str, str]:
    from agentrl.tasks.kg import data as kg_data

    return {f"kg/{name}": content for name, content in kg_data.generate().items()}


def webshop_files() -> dict[str, str]:
    from agentrl.tasks.webshop import data as webshop_data

    return {f"webshop/{name}": content for name, content in webshop_data.generate().items()}


GENERATORS: dict[str, Callable[[], dict[str, str]]] = {"os": os_files, "db": db_files, "kg": kg_files,
                                                        "webshop": webshop_files}


def stale_files(root: Path, tasks: Iterable[str]) -> list[Path]:
    """The files under `root` that are missing or differ from what the tasks' generators give."""
    return [root / rel for name in tasks for rel, content in GENERATORS[name]().items()
            if not (root / rel).is_file() or (root / rel).read_text(encoding="utf-8") != content]


def write_files(root: Path, tasks: Iterable[str]) -> list[tuple[Path, int]]:
    """Write the tasks' files under `root`; returns (path, bytes) for each."""
    written = []
    for name in tasks:
        for rel, content in GENERATORS[name]().items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content, encoding="utf-8")
            written.append((path, len(content.encode())))
    return written
