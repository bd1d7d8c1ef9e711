"""AgentBench check: replay AgentBench's own gold answers through our tasks and classify every failure.

    python -m jobs.agentbench_check --agentbench ~/AgentBench --tasks os,db --split test
    python -m jobs.agentbench_check --agentbench ~/AgentBench --tasks db --backend mariadb --out check.json
    srun -n1 python -m jobs.agentbench_check --agentbench $AB --tasks db --backend mariadb --workers 8
    # submitit: executor.submit(jobs.agentbench_check.main, ["--agentbench", ab, "--tasks", "db"])

Prints one line per (task, split) and the failures with their evidence; `--out` writes {task: {split:
{passed, total, failures: {class: [ids]}}}} (plus the evidence under "details"). The replays and their
failure classes are `agentrl.checks.replay`.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from agentrl.checks.replay import run_checks


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agentbench", required=True, help="an AgentBench checkout (THUDM/AgentBench, main)")
    parser.add_argument("--tasks", default="os,db")
    parser.add_argument("--split", default="test")
    parser.add_argument("--backend", default="sqlite", choices=("sqlite", "mariadb"), help="db's engine")
    parser.add_argument("--limit", type=int, default=None, help="first N samples of each split")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = sorted(set(tasks) - {"os", "db"})
    if unknown:
        raise SystemExit(f"agentbench_check: no gold replay for task {unknown[0]!r} (os, db)")
    report = run_checks(args.agentbench, tasks, args.split, args.backend, args.limit, args.workers)
    for name, splits in report.items():
        result = splits[args.split]
        if "error" in result:
            print(f"{name:8s} {args.split:6s} cannot run: {result['error']}")
            continue
        counts = ", ".join(f"{k}: {len(v)}" for k, v in result["failures"].items()) or "no failures"
        print(f"{name:8s} {args.split:6s} {result['passed']}/{result['total']} passed ({counts})")
        for index, why in result["details"].items():
            print(f"    {index}: {why}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
