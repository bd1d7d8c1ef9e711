"""Run the task contract (agentrl.envs.checks.contract) on a task from the shell, before training on it.

    python -m jobs.check_task agentrl.envs.tasks.example:GuessTask
    PYTHONPATH=. python -m jobs.check_task mypkg.mytask:MyTask --samples 50 --splits train,test
    python -m jobs.check_task db --option backend=sqlite               # a built-in task by name
    srun -n1 python -m jobs.check_task mypkg.mytask:MyTask            # the same inside an allocation

Prints what the scripted expert played and solved per split and exits 0, or prints the first broken
rule (`ContractError`) and exits 1. A task that cannot be imported or built exits 2.
"""
from __future__ import annotations

import argparse
import sys

from agentrl.envs.checks.contract import ContractError, check_task
from agentrl.envs.tasks import get_task, parse_task_options, task_name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("task", help="a task name (lookup, os, ...) or an import path pkg.module:Class")
    ap.add_argument("--samples", type=int, default=20, help="indices per split the expert plays (default 20)")
    ap.add_argument("--splits", default="train,test", help="splits the task must have (default train,test)")
    ap.add_argument("--min-success", type=float, default=0.9, help="share the expert must solve (default 0.9)")
    ap.add_argument("--option", action="append", default=[], help="a task constructor option key=value (repeat)")
    args = ap.parse_args(argv)
    try:
        task = get_task(args.task, **parse_task_options(args.option))
        name = task_name(args.task)
    except (ImportError, AttributeError, KeyError, TypeError, ValueError) as e:
        print(f"cannot build task {args.task!r}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    splits = tuple(s for s in args.splits.split(",") if s)
    try:
        report = check_task(task, samples=args.samples, splits=splits, min_success=args.min_success)
    except ContractError as e:
        print(f"task {name!r} breaks the contract: {e}", file=sys.stderr)
        return 1
    for split in splits:
        print(f"{name} {split}: expert solved {report.solved[split]}/{report.played[split]} "
              f"in {report.turns[split]:.1f} turns on average")
    print(f"task {name!r} ({args.task}) meets the contract; train on it with "
          f"'envs.tasks=[{args.task}]' (see docs/tasks.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
