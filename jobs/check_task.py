"""Run the task contract (agentrl.checks.contract) on a task from the shell, before training on it.

    python -m jobs.check_task agentrl.tasks.example:GuessTask
    PYTHONPATH=. python -m jobs.check_task mypkg.mytask:MyTask --samples 50 --splits train,test
    python -m jobs.check_task db --option backend=sqlite               # a built-in task by name
    python -m jobs.check_task os --preset agentbench-qwen2.5-7b        # the time limits as that run sets them
    srun -n1 python -m jobs.check_task mypkg.mytask:MyTask            # the same inside an allocation

Prints the task's time budget per message (`envs.message_budget_s` as the worker applies it, and the
task's own limits within it, from its options), then what the scripted expert played and solved per
split, and exits 0; or prints the first broken rule (`ContractError`) and exits 1. A task that cannot be
imported or built, or options that do not fit the task's `Options`, exit 2.
"""
from __future__ import annotations

import argparse
import sys

from agentrl.checks.contract import ContractError, check_task
from agentrl.config import ConfigError, RunConfig, load_config
from agentrl.config.task_options import describe_budget, task_options_of
from agentrl.tasks import get_task, parse_task_options, task_name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("task", help="a task name (lookup, os, ...) or an import path pkg.module:Class")
    ap.add_argument("--samples", type=int, default=20, help="indices per split the expert plays (default 20)")
    ap.add_argument("--splits", default="train,test", help="splits the task must have (default train,test)")
    ap.add_argument("--min-success", type=float, default=0.9, help="share the expert must solve (default 0.9)")
    ap.add_argument("--option", action="append", default=[], help="a task constructor option key=value (repeat)")
    ap.add_argument("--preset", help="the run config whose envs and controller settings give the time budget "
                                     "(default: the defaults)")
    args = ap.parse_args(argv)
    try:
        cfg = load_config(args.preset, trains=False) if args.preset else RunConfig()
        options = parse_task_options(args.option)
        typed = task_options_of(args.task, options, args.task)
        task = get_task(args.task, **options)
        name = task_name(args.task)
    except (ImportError, AttributeError, KeyError, TypeError, ValueError) as e:  # ConfigError is a ValueError
        why = str(e) if isinstance(e, ConfigError) else f"{type(e).__name__}: {e}"
        print(f"cannot build task {args.task!r}: {why}", file=sys.stderr)
        return 2
    print(f"{name}: {describe_budget(typed, cfg.envs, cfg.controller)}")
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
