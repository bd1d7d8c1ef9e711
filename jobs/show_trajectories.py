"""Print episodes as readable conversations: a run's trajectories from its HDF5 shards, or an evaluation's
transcripts (what `jobs.eval` wrote beside its results).

    python -m jobs.show_trajectories runs/demo                          # the last 3 rollout trajectories
    python -m jobs.show_trajectories runs/demo --task unlock --status turn_limit -n 5
    python -m jobs.show_trajectories runs/demo --source expert-0 -n 1    # a warm-start demonstration
    python -m jobs.show_trajectories runs/demo-eval --task db --status turn_limit --limit 3
    python -m jobs.show_trajectories runs/demo-eval/eval-test-greedy.jsonl --failed --index test-7 --full
    srun -n1 python -m jobs.show_trajectories $RUN_DIR --status env_error

A run: reads shards/<source>/*.h5 (default: every rollout-* directory, newest shards first) and decodes
tokens with the run's tokenizer (RUN_DIR/model, or model.path of the run's config.yaml); the last N that
match. An evaluation (a directory of jobs.eval's results, a <stem>.jsonl or a <stem>.transcripts.jsonl.gz):
the messages of each episode (the prompt, every assistant message with its tool calls, every observation,
how it ended), the first N that match; observations are cut at --width characters unless --full. A
directory with several evaluations shows the newest (its other files are named). The library is
`agentrl.monitor.trajectory_text` (and `agentrl.monitor.eval_transcripts`, the evaluation's file).
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.monitor.eval_stats import STATUSES
from agentrl.monitor.eval_transcripts import read_transcripts, transcripts_path
from agentrl.monitor.trajectory_text import (
    pick_latest,
    pick_transcripts,
    render_plain,
    render_transcript,
    run_tokenizer,
    shard_dirs,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", type=Path, help="a run directory, or an evaluation's directory or file")
    ap.add_argument("--source", help="a run's shard directory under shards/ (default: every rollout-*)")
    ap.add_argument("--task", help="only this task")
    ap.add_argument("--status", help=f"only this ending ({', '.join(STATUSES)})")
    ok = ap.add_mutually_exclusive_group()
    ok.add_argument("--success", action="store_true", help="only episodes the task counted a success")
    ok.add_argument("--failed", action="store_true", help="only episodes that were not a success")
    ap.add_argument("--min-reward", type=float, help="only episodes with at least this reward")
    ap.add_argument("--max-reward", type=float, help="only episodes with at most this reward")
    ap.add_argument("--index", help="only this sample of the split (e.g. test-7)")
    ap.add_argument("--sample", type=int, help="an evaluation's run of the index (0..runs-1)")
    ap.add_argument("-n", "--limit", dest="n", type=int, default=3, help="how many (default 3; 0: all)")
    ap.add_argument("--full", action="store_true", help="an evaluation's observations and prompt in full")
    ap.add_argument("--width", type=int, default=600, help="an observation's characters shown (default 600)")
    return ap.parse_args(argv)


def outcome_filter(args: argparse.Namespace, success: Callable[[Any], float], reward: Callable[[Any], float],
                   index: Callable[[Any], str]) -> Callable[[Any], bool]:
    """The filters on outcome and sample, over episodes of either kind (their getters)."""
    def keep(e: Any) -> bool:
        return ((not args.success or success(e) > 0.5) and (not args.failed or success(e) <= 0.5)
                and (args.min_reward is None or reward(e) >= args.min_reward)
                and (args.max_reward is None or reward(e) <= args.max_reward)
                and (args.index is None or index(e) == args.index))
    return keep


def transcripts_file(path: Path) -> Path | None:
    """The transcripts file that `path` names: itself, the one beside a results file, or a directory's newest."""
    if path.name.endswith(".transcripts.jsonl.gz"):
        return path
    if path.suffix == ".jsonl":
        return transcripts_path(path)
    found = sorted(path.glob("*.transcripts.jsonl.gz"), key=lambda p: p.stat().st_mtime, reverse=True)
    if len(found) > 1:
        print(f"showing {found[0].name}; also here: {', '.join(p.name for p in found[1:])} (name one to pick it)",
              file=sys.stderr)
    return found[0] if found else None


def show_run(args: argparse.Namespace) -> int:
    from agentrl.transport.shards import ShardReader, read_shard

    shards = [p for d in shard_dirs(args.path, args.source) for p in ShardReader(d).available()]
    keep = outcome_filter(args, lambda t: t.metrics.get("success", 0.0), lambda t: t.reward, lambda t: t.index)
    trajs = pick_latest(shards, read_shard, args.n, args.task, args.status, keep)
    if not trajs:
        print("no trajectory matches", file=sys.stderr)
        return 1
    tok = run_tokenizer(args.path)
    print("\n\n".join(render_plain(t, tok) for t in trajs))
    return 0


def show_evaluation(args: argparse.Namespace, path: Path) -> int:
    keep = outcome_filter(args, lambda e: e["success"], lambda e: e["reward"], lambda e: e["index"])
    episodes = pick_transcripts(read_transcripts(path), args.n, args.task, args.status,
                                lambda e: keep(e) and (args.sample is None or e["sample"] == args.sample))
    if not episodes:
        print(f"no episode of {path} matches", file=sys.stderr)
        return 1
    width, prompt_width = (None, None) if args.full else (args.width, min(args.width, 300))
    print("\n\n".join(render_transcript(e, width, prompt_width) for e in episodes))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if (args.path / "shards").is_dir():
        return show_run(args)
    path = transcripts_file(args.path) if args.path.exists() else None
    if path is None or not path.exists():
        print(f"{args.path}: neither a run directory (shards/) nor an evaluation with transcripts "
              "(<stem>.transcripts.jsonl.gz, written by jobs.eval)", file=sys.stderr)
        return 2
    return show_evaluation(args, path)


if __name__ == "__main__":
    sys.exit(main())
