"""Print trajectories from a run's HDF5 shards as readable conversations: every message, the tool calls
the policy wrote (marked with the policy version and engine that sampled them), the observations, and
how the episode ended (reward, status, turns, metrics).

    python -m jobs.show_trajectories runs/demo                          # the last 3 rollout trajectories
    python -m jobs.show_trajectories runs/demo --task unlock --status turn_limit -n 5
    python -m jobs.show_trajectories runs/demo --source expert-0 -n 1    # a warm-start demonstration
    srun -n1 python -m jobs.show_trajectories $RUN_DIR --status env_error

Reads shards/<source>/*.h5 (default: every rollout-* directory, newest shards first) and decodes tokens
with the run's tokenizer (RUN_DIR/model, or model.path of the run's config.yaml). The library is
`agentrl.monitor.trajectory_text`.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentrl.monitor.trajectory_text import pick_latest, render_plain, run_tokenizer, shard_dirs
from agentrl.transport.shards import ShardReader, read_shard


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--source", help="a shard directory under shards/ (default: every rollout-*)")
    ap.add_argument("--task", help="only this task")
    ap.add_argument("--status", help="only this ending (completed, invalid_action, turn_limit, context_limit, "
                                     "truncated, env_error, cancelled)")
    ap.add_argument("-n", type=int, default=3, help="how many (default 3)")
    args = ap.parse_args(argv)
    if not (args.run_dir / "shards").is_dir():
        print(f"{args.run_dir} has no shards/ directory: is it a run directory?", file=sys.stderr)
        return 2
    shards = [p for d in shard_dirs(args.run_dir, args.source) for p in ShardReader(d).available()]
    trajs = pick_latest(shards, read_shard, args.n, args.task, args.status)
    if not trajs:
        print("no trajectory matches", file=sys.stderr)
        return 1
    tok = run_tokenizer(args.run_dir)
    print("\n\n".join(render_plain(t, tok) for t in trajs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
