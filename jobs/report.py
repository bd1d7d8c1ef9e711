"""The run report: PNG plots and a markdown summary of a run dir, finished or still running.

    python -m jobs.report runs/demo                      # writes runs/demo/report/report.md + report/plots/*.png
    python -m jobs.report runs/demo --eval runs/demo/report/eval-test.jsonl --label "tiny demo model"
    python -m jobs.report runs/demo --out /tmp/demo-report
    srun -n1 python -m jobs.report $RUN_DIR               # on a login or compute node: no GPU, no torch needed

Reads config.yaml, tb/ (TensorBoard event files), shards/rollout-*/ (HDF5), report/eval*-v<N>.json,
summary.json and trainer.json; what is missing is skipped with a line saying so. --eval adds results
files of scored episodes (JSONL, agentrl/monitor/eval_results.py) as a table and a plot.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from agentrl.monitor.eval_results import aggregate, read_results
from agentrl.monitor.eval_tables import terminal_table
from agentrl.monitor.report import write_report
from agentrl.monitor.run_data import load_run
from agentrl.transport.shards import ShardReader, read_shard
from agentrl.types import Trajectory


def rollout_trajectories(run_dir: Path) -> Iterator[Trajectory]:
    """Every trajectory the rollout ranks wrote (shards/rollout-*/), shard by shard."""
    for d in sorted((run_dir / "shards").glob("rollout-*")):
        for path in ShardReader(d).available():
            yield from read_shard(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--eval", action="append", default=[], type=Path, metavar="FILE",
                    help="a results file of scored episodes (JSONL); may be given more than once")
    ap.add_argument("--label", default="this run", help="the model's name in the AgentBench-FC table")
    ap.add_argument("--k", default="all", help="pass@k for these k, e.g. 1,2,4 (default all: 1 to the fewest "
                                               "samples any index has)")
    ap.add_argument("--bootstrap", type=int, default=0, metavar="N",
                    help="also a percentile bootstrap interval over samples, from N resamples (default: none)")
    ap.add_argument("--out", type=Path, help="where to write (default RUN_DIR/report)")
    args = ap.parse_args(argv)
    if not args.run_dir.is_dir():
        print(f"{args.run_dir} is not a directory", file=sys.stderr)
        return 2
    run = load_run(args.run_dir, rollout_trajectories(args.run_dir))
    results = None
    if args.eval:
        episodes = [e for f in args.eval for e in read_results(f)]
        if not episodes:
            print(f"no scored episodes in {', '.join(map(str, args.eval))}", file=sys.stderr)
        else:
            ks = range(1, 1 + max(Counter((e.task, e.split, e.index) for e in episodes).values())) \
                if args.k == "all" else [int(k) for k in args.k.split(",")]
            results = aggregate(episodes, ks=ks, bootstrap_resamples=args.bootstrap)
            print(terminal_table(results))
    report = write_report(run, args.out or args.run_dir / "report", results, args.label)
    for line in run.missing:
        print(f"skipped: {line}")
    print(f"report: {report.path} ({len(report.plots)} plots in {report.path.parent / 'plots'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
