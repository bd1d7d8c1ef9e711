"""Expert report: how often each task's scripted expert solves its own samples, per task and split.

    python -m jobs.expert_report --tasks os,db --splits train,test,dev --limit 50
    python -m jobs.expert_report --tasks db --option db.backend=mariadb --out runs/report/db-mariadb.json
    srun -n1 python -m jobs.expert_report --tasks os,db --limit 200 --workers 8     # inside an allocation
    # submitit: executor.submit(jobs.expert_report.main, ["--tasks", "os,db", "--out", "report.json"])

Task-agnostic: it builds each task with `get_task(name, **options)` and plays episodes through
`Session` (the layer the env worker uses), the expert's message each turn, until the episode ends.
A split a task does not have is left out, not counted as a failure. Episodes of tasks that say
they block (`blocking = True`, e.g. sandboxes and databases) run `--workers` at a time in threads.
Prints one line per (task, split) and writes the whole report as JSON with `--out`. The library is
`agentrl.checks.expert_report`.
"""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from agentrl.checks.expert_report import SplitReport, expert_reports, report_json, task_options


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
    try:
        options = task_options(args.option)
    except ValueError as e:
        ap.error(str(e))
    reports = []
    for r in expert_reports([t for t in args.tasks.split(",") if t], [s for s in args.splits.split(",") if s],
                            args.limit, args.workers, options):
        reports.append(r)
        print(r.line(), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report_json(args.option, reports), indent=1))
    return reports


if __name__ == "__main__":
    main()
