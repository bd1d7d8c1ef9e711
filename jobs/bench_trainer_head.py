"""Benchmark: peak RSS and seconds of one RL step, the whole-vocabulary head (the trainer's old head) against
the tiled head on the trained positions only, each side in a fresh process, interleaved (full, lean, full, ...).

    python -m jobs.bench_trainer_head                           # the issue's shape: hidden 64, 2 layers, vocab
                                                                # 151,936, 4,096 tokens in one micro-batch, FSDP2 bf16
    python -m jobs.bench_trainer_head --tokens 1024 --parallel none   # smaller and fp32: minutes
    srun -c 2 --mem 16G python -m jobs.bench_trainer_head

Each side's process builds the model and batch, notes its RSS, takes one `rl_step` (lean) or
`full_vocab_rl_step` (full, `agentrl.bench.trainer_head`), and reports its peak RSS (`ru_maxrss`) and the step's
seconds. The machine's load average (1 minute) is recorded before each run. Prints a table (median, min-max over
the repeats, per side, and the per-pair ratios full/lean) and writes it to --out as JSON with a `machine` record.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from agentrl.bench import repeat


def _child(args: argparse.Namespace) -> None:
    import torch

    from agentrl.bench.trainer_head import HeadBench, measure

    torch.set_num_threads(args.threads)
    b = HeadBench(hidden=args.hidden, layers=args.layers, vocab=args.vocab, tokens=args.tokens,
                  trajectories=args.trajectories, parallel=args.parallel, seed=args.seed)
    print(json.dumps(measure(args.side, b)), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--tokens", type=int, default=4096, help="tokens of the step, all in one micro-batch")
    ap.add_argument("--trajectories", type=int, default=8)
    ap.add_argument("--parallel", choices=["fsdp2", "none"], default="fsdp2",
                    help="fsdp2: one-rank FSDP2, bf16 compute (gpu_check's setting) | none: one process, fp32")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each side's process")
    ap.add_argument("--sides", nargs="+", choices=["full", "lean"], default=["full", "lean"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("runs/bench/trainer_head.json"))
    ap.add_argument("--side", choices=["full", "lean"], help=argparse.SUPPRESS)
    repeat.add_args(ap)
    args = ap.parse_args()
    if args.side:
        _child(args)
        return
    load_before = os.getloadavg()
    cpus = repeat.parse_cpus(args.cpus)
    env = repeat.pin(cpus, args.threads)
    base = [f"--{k}={getattr(args, k)}" for k in ("hidden", "layers", "vocab", "tokens", "trajectories", "parallel",
                                                  "threads", "seed")]

    def side(name: str):
        def run(i: int) -> dict[str, float]:
            load = os.getloadavg()[0]
            cmd = [sys.executable, "-m", "jobs.bench_trainer_head", *base, "--side", name]
            out = subprocess.run(cmd, env=repeat.child_env(env), capture_output=True, text=True, check=False)
            if out.returncode != 0:
                raise RuntimeError(f"{name}: exit {out.returncode}\n{out.stderr[-3000:]}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            return {k: float(v) for k, v in r.items() if isinstance(v, (int, float))} | {"load_1min": load}
        return run

    samples = repeat.interleave({s: side(s) for s in args.sides}, args.repeats, echo=lambda m: print(m, flush=True))
    ratios = [repeat.Ratio("peak_rss_full_over_lean", "full", "peak_rss_gib", "lean", "peak_rss_gib"),
              repeat.Ratio("step_rss_full_over_lean", "full", "step_rss_increase_gib", "lean", "step_rss_increase_gib"),
              repeat.Ratio("step_s_full_over_lean", "full", "step_s", "lean", "step_s")]
    summary = repeat.summarize(samples, ratios if len(args.sides) == 2 else [])
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "side"}
    result = {"config": config, "summary": summary, "machine": repeat.machine(args.seed, cpus, env, load_before)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(repeat.table(summary))
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
