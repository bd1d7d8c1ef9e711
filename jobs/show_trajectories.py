"""Print trajectories from a run's HDF5 shards as readable conversations: every message, the tool calls
the policy wrote (marked with the policy version and engine that sampled them), the observations, and
how the episode ended (reward, status, turns, metrics).

    python -m jobs.show_trajectories runs/demo                          # the last 3 rollout trajectories
    python -m jobs.show_trajectories runs/demo --task unlock --status turn_limit -n 5
    python -m jobs.show_trajectories runs/demo --source expert-0 -n 1    # a warm-start demonstration
    srun -n1 python -m jobs.show_trajectories $RUN_DIR --status env_error

Reads shards/<source>/*.h5 (default: every rollout-* directory, newest shards first) and decodes tokens
with the run's tokenizer (RUN_DIR/model, or model.path of the run's config.yaml).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentrl.monitor.trajectory_text import spans
from agentrl.transport.shards import ShardReader, read_shard
from agentrl.types import Trajectory


def render(t: Trajectory, tok) -> str:
    lines = [f"=== {t.task} {t.index} (group {t.group_id}, id {t.traj_id})"]
    for generated, ids, version, engine in spans(t):
        text = tok.decode(ids.tolist(), skip_special_tokens=False)
        if generated:
            lines.append(f"--- policy v{version}, engine {engine}, {len(ids)} tokens:")
            lines.append(text.rstrip("\n"))
            lines.append("---")
        else:
            lines.append(text.rstrip("\n"))
    metrics = ", ".join(f"{k}={v:g}" for k, v in sorted(t.metrics.items()))
    lines.append(f"=== reward {t.reward:g}, status {t.status.value}, {t.num_turns} turns; {metrics}")
    return "\n".join(lines)


def tokenizer_of(run_dir: Path):
    from transformers import AutoTokenizer

    model_dir = run_dir / "model"
    if not model_dir.is_dir():
        from agentrl.config import load_config

        path = load_config(str(run_dir / "config.yaml")).model.path
        model_dir = Path(path) if path else model_dir
    return AutoTokenizer.from_pretrained(str(model_dir))


def pick(run_dir: Path, source: str | None, task: str | None, status: str | None, n: int) -> list[Trajectory]:
    """The last `n` matching trajectories, reading the newest shards first."""
    dirs = [run_dir / "shards" / source] if source else sorted((run_dir / "shards").glob("rollout-*"))
    shards = [p for d in dirs for p in ShardReader(d).available()]
    shards.sort(key=lambda p: (p.stat().st_mtime, p.name), reverse=True)
    found: list[Trajectory] = []
    for path in shards:
        matching = [t for t in read_shard(path) if (task is None or t.task == task)
                    and (status is None or t.status.value == status)]
        found = matching + found  # an older shard's trajectories come before a newer one's
        if len(found) >= n:
            break
    return found[-n:] if n > 0 else []


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
    trajs = pick(args.run_dir, args.source, args.task, args.status, args.n)
    if not trajs:
        print("no trajectory matches", file=sys.stderr)
        return 1
    tok = tokenizer_of(args.run_dir)
    print("\n\n".join(render(t, tok) for t in trajs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
