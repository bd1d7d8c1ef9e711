"""How often each task's scripted expert solves its own samples, per task and split.

Task-agnostic: each task is built with `get_task(name, **options)` and played through `Session` (the layer
the env worker uses, via `expert.play`), the expert's message each turn, until the episode ends. A split a
task does not have is left out, not counted as a failure. Episodes of tasks that say they block
(`blocking = True`, e.g. sandboxes and databases) run `workers` at a time in threads.
`jobs/expert_report.py` is the command line over it.
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from agentrl.checks.expert import play
from agentrl.config import Scalar, parse_override
from agentrl.tasks import get_task
from agentrl.tasks.api import EnvError, Task
from agentrl.types import Status

log = logging.getLogger("agentrl.checks.expert_report")


@dataclass
class SplitReport:
    task: str
    split: str
    episodes: int = 0
    solved: int = 0
    errors: int = 0
    """Episodes that ended as env_error or could not start (infrastructure, not the expert)."""
    mean_turns: float = 0.0
    seconds: float = 0.0
    statuses: dict[str, int] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    """Indices the expert did not solve (first 50)."""

    @property
    def success(self) -> float:
        return self.solved / self.episodes if self.episodes else math.nan

    def line(self) -> str:
        """One line for a terminal."""
        return (f"{self.task:10s} {self.split:8s} solved {self.solved:4d}/{self.episodes:<4d} = {self.success:6.1%}  "
                f"errors {self.errors:3d}  turns {self.mean_turns:4.1f}  {self.seconds:6.1f} s")


def report_split(task: Task, split: str, limit: int | None = None, workers: int = 4) -> SplitReport:
    """The expert over the first `limit` indices of `split` (all when None)."""
    out = SplitReport(task=task.name, split=split)
    indices = task.indices(split)[:limit]
    start = time.monotonic()
    threads = workers if getattr(task, "blocking", False) else 1
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        results = list(pool.map(lambda i: (i, *play(task, i)), indices))
    turns = 0
    for index, reward, status, n in results:
        out.episodes += 1
        turns += n
        out.statuses[status.value] = out.statuses.get(status.value, 0) + 1
        # success is reward 1.0 in every built-in task; webshop's partial rewards (a score in [0, 1]) are not
        if status == Status.COMPLETED and reward >= 1.0:
            out.solved += 1
        else:
            out.errors += status == Status.ENV_ERROR
            if len(out.failed) < 50:
                out.failed.append(index)
    out.mean_turns = turns / max(out.episodes, 1)
    out.seconds = time.monotonic() - start
    return out


def task_options(items: list[str]) -> dict[str, dict[str, Any]]:
    """`task.key=value` (dots go deeper: `os.sandbox.backend=bwrap`) into {task: {key: value}}; an item
    without a task part is a ValueError naming it."""
    options: dict[str, dict[str, Any]] = {}
    for item in items:
        key, value = parse_override(item)
        value = value.parsed if isinstance(value, Scalar) else value  # a task option: what YAML reads
        parts = key.split(".")
        if len(parts) < 2:
            raise ValueError(f"--option {item!r}: write it as task.option=value")
        node = options.setdefault(parts[0], {})
        for p in parts[1:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return options


def expert_reports(tasks: list[str], splits: list[str], limit: int | None = None, workers: int = 4,
                   options: dict[str, dict[str, Any]] | None = None) -> Iterator[SplitReport]:
    """A report per (task, split) the task has, as each is done; a task's `close()` runs after its splits
    (e.g. a private database server it started)."""
    options = options or {}
    for name in tasks:
        task = get_task(name, **options.get(name, {}))
        try:
            for split in splits:
                try:
                    task.indices(split)
                except EnvError:
                    log.info("%s has no split %r", name, split)
                    continue
                yield report_split(task, split, limit, workers)
        finally:
            close = getattr(task, "close", None)
            if callable(close):
                close()


def report_json(options: list[str], reports: list[SplitReport]) -> dict[str, Any]:
    """The whole report as the job writes it: the options it ran with, and each report with its success."""
    return {"options": options, "reports": [{**asdict(r), "success": r.success} for r in reports]}
