"""Expert report: how often each task's scripted expert solves its own samples, per task and split.

    python -m jobs.expert_report --tasks os,db --splits train,test,dev --limit 50
    python -m jobs.expert_report --tasks db --option db.backend=mariadb --out runs/report/db-mariadb.json
    srun -n1 python -m jobs.expert_report --tasks os,db --limit 200 --workers 8     # inside an allocation
    # submitit: executor.submit(jobs.expert_report.main, ["--tasks", "os,db", "--out", "report.json"])

Task-agnostic: it builds each task with `get_task(name, **options)` and plays episodes through
`Session` (the layer the env worker uses), the expert's message each turn, until the episode ends.
A split a task does not have is reported as missing, not as a failure. Episodes of tasks that say
they block (`blocking = True`, e.g. sandboxes and databases) run `--workers` at a time in threads.
Prints one line per (task, split) and writes the whole report as JSON with `--out`.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentrl.config import Scalar, parse_override
from agentrl.envs.api import EnvError, Task
from agentrl.envs.expert import play
from agentrl.envs.tasks import get_task
from agentrl.types import Status

log = logging.getLogger("agentrl.jobs.expert_report")


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
    """`task.key=value` (dots go deeper: `os.sandbox.backend=bwrap`) into {task: {key: value}}."""
    options: dict[str, dict[str, Any]] = {}
    for item in items:
        key, value = parse_override(item)
        value = value.parsed if isinstance(value, Scalar) else value  # a task option: what YAML reads
        parts = key.split(".")
        if len(parts) < 2:
            raise SystemExit(f"--option {item!r}: write it as task.option=value")
        node = options.setdefault(parts[0], {})
        for p in parts[1:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return options


def run(tasks: list[str], splits: list[str], limit: int | None, workers: int,
        options: dict[str, dict[str, Any]]) -> list[SplitReport]:
    reports = []
    for name in tasks:
        task = get_task(name, **options.get(name, {}))
        try:
            for split in splits:
                try:
                    task.indices(split)
                except EnvError:
                    log.info("%s has no split %r", name, split)
                    continue
                r = report_split(task, split, limit, workers)
                reports.append(r)
                print(f"{r.task:10s} {r.split:8s} solved {r.solved:4d}/{r.episodes:<4d} = {r.success:6.1%}  "
                      f"errors {r.errors:3d}  turns {r.mean_turns:4.1f}  {r.seconds:6.1f} s", flush=True)
        finally:
            close = getattr(task, "close", None)
            if callable(close):  # e.g. a private database server the task started
                close()
    return reports


def main(argv: list[str] | None = None) -> list[SplitReport]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", required=True, help="comma-separated task names")
    ap.add_argument("--splits", default="train,test,dev")
    ap.add_argument("--limit", type=int, default=None, help="first N indices per split (default all)")
    ap.add_argument("--workers", type=int, default=4, help="episodes at once for blocking tasks")
    ap.add_argument("--option", action="append", default=[], help="task option, e.g. db.backend=mariadb")
    ap.add_argument("--out", type=Path, default=None, help="write the report as JSON here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    reports = run([t for t in args.tasks.split(",") if t], [s for s in args.splits.split(",") if s],
                  args.limit, args.workers, task_options(args.option))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        rows = [{**asdict(r), "success": r.success} for r in reports]
        args.out.write_text(json.dumps({"options": args.option, "reports": rows}, indent=1))
    return reports


if __name__ == "__main__":
    main()
