"""Gold replays over a split, and over a checkout's tasks (`run_checks`: what `jobs.agentbench_check` prints)."""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agentrl.checks.replay.classes import Outcome
from agentrl.checks.replay.db_replay import replay_db
from agentrl.checks.replay.os_replay import replay_os
from agentrl.tasks import get_task
from agentrl.tasks.api import EnvError, Task
from agentrl.tasks.db import DbTask

Replay = Callable[[Any, str], Outcome]


def check(task: Task, split: str, replay: Replay, limit: int | None, workers: int) -> dict[str, Any]:
    indices = task.indices(split)[:limit]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        outcomes = list(pool.map(lambda i: (i, *replay(task, i)), indices))
    failures: dict[str, list[str]] = {}
    details: dict[str, str] = {}
    for index, passed, kind, evidence in outcomes:
        if not passed:
            failures.setdefault(kind, []).append(index)
            details[index] = f"{kind}: {evidence}"
    return {"passed": sum(o[1] for o in outcomes), "total": len(outcomes), "failures": failures, "details": details}



def build(name: str, checkout: str | Path, backend: str = "sqlite") -> tuple[Task, Replay]:
    """Task `name` on an AgentBench checkout (AgentBench-FC's faithful protocol) and its gold replay."""
    if name == "db":
        return DbTask(source="agentbench", agentbench_dir=checkout, backend=backend), replay_db
    if name == "os":
        return get_task("os", source="agentbench", agentbench_dir=checkout), replay_os
    raise ValueError(f"agentbench_check: no gold replay for task {name!r} (os, db)")


def run_checks(checkout: str | Path, tasks: list[str], split: str = "test", backend: str = "sqlite",
               limit: int | None = None, workers: int = 4) -> dict[str, Any]:
    """{task: {split: `check`'s result, or {"error": why}}} for each of `tasks` built on `checkout` (a
    checkout a task cannot read is an error entry, not an exception)."""
    report: dict[str, Any] = {}
    for name in tasks:
        task: Task | None = None
        try:
            task, replay = build(name, checkout, backend)
            report[name] = {split: check(task, split, replay, limit, workers)}
        except (OSError, ValueError, KeyError, EnvError) as e:  # a checkout this task cannot read
            report[name] = {split: {"error": f"{type(e).__name__}: {e}"}}
        finally:
            if callable(getattr(task, "close", None)):
                task.close()  # type: ignore[union-attr]
    return report
