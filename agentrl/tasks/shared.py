"""What the AgentBench-FC tasks (`kg`, `alfworld`, `webshop`) and `bfcl` share.

Where task data lives, how an index names a sample of a split, the shape of the scripted expert's
messages, and the error a task gives when its optional dependency is not installed. Nothing task
specific lives here.
"""
from __future__ import annotations

import importlib
import json
import os
import random
from pathlib import Path
from types import ModuleType
from typing import Any

from agentrl.tasks.api import EnvError

REPO_DATA = Path(__file__).resolve().parents[2] / "data"


def data_root() -> Path:
    """The project's `data/` folder; `AGENTRL_DATA_DIR` overrides it (an installed copy, a cluster path)."""
    return Path(os.environ.get("AGENTRL_DATA_DIR") or REPO_DATA)


def env_path(var: str) -> Path | None:
    """A path a user configured through the environment variable `var`, or None."""
    value = os.environ.get(var, "").strip()
    return Path(value).expanduser() if value else None


def read_json(path: Path, what: str) -> Any:
    """JSON from `path`; a missing file says which data it is and how to make it."""
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found at {path} (generate it with `python -m jobs.make_task_data`, "
                                f"or point the task at your own copy)")
    with path.open() as f:
        return json.load(f)


def split_index(task: str, index: str, sizes: dict[str, int]) -> tuple[str, int]:
    """Parse "<split>-<n>" against the split sizes; anything else is the caller's bad request."""
    split, _, num = index.rpartition("-")
    if split not in sizes or not num.isdigit() or num != str(int(num)) or int(num) >= sizes[split]:
        raise EnvError("bad_request", f"{task} has no sample {index!r}")
    return split, int(num)


def split_indices(task: str, split: str, sizes: dict[str, int]) -> list[str]:
    if split not in sizes:
        raise EnvError("bad_request", f"{task} has no split {split!r} (splits: {', '.join(sizes)})")
    return [f"{split}-{i}" for i in range(sizes[split])]


def checked_skill(task: str, skill: float) -> float:
    """The task option `expert_skill` as a float, or the ValueError that names the task and the bound."""
    if not 0.0 <= float(skill) <= 1.0:
        raise ValueError(f"{task}: expert_skill must be in [0, 1], got {skill!r}")
    return float(skill)


def expert_skilled(task: str, index: str, skill: float) -> bool:
    """Whether the scripted expert plays sample `index` right, at `skill` (the task option `expert_skill`).

    The draw is fixed per (task, sample): a sample's demonstrations agree across runs, workers and retries, and
    the share of skilled samples in a split is `skill` up to sampling. An unskilled expert of an AgentBench-FC
    family makes that family's one mistake of its kind: it gives its final answer before it has gathered what the
    answer needs (a guess, a commit without the query, a purchase without the search), a choice the prompt lets
    the policy see through and the reward tells apart, so that RL has something to learn beyond imitation."""
    if skill >= 1.0:
        return True
    return random.Random(f"{task}-expert:{index}").random() < skill


def call_message(calls: list[tuple[str, dict[str, Any]]], turn: int, content: str = "") -> dict[str, Any]:
    """An assistant message with the given (name, arguments) tool calls; ids are unique per turn."""
    return {"role": "assistant", "content": content, "tool_calls": [
        {"id": f"call_{turn}_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        for i, (name, args) in enumerate(calls)]}


def text_message(content: str) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def import_optional(module: str, install: str, task: str) -> ModuleType:
    """Import a task's optional dependency, or fail with the command that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"task {task!r} needs the {module.split('.')[0]!r} package; install it with "
                          f"`{install}` (install.sh does) — {e}") from e
