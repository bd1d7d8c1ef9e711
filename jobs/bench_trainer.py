"""Benchmark: tokens/s of one train step through our trainer (`rl_step`) against a bare PyTorch
forward/backward/step on the same packed micro-batches of the same model, in the same process.

    python -m jobs.bench_trainer                                   # CPU defaults, ~2 min on one core
    python -m jobs.bench_trainer --hidden 1024 --layers 8 --vocab 32000 --device cuda --out runs/bench/gpu.json
    srun -p gpu --gpus 1 python -m jobs.bench_trainer --device cuda

The bare step (`agentrl/trainer/bare.py`) is the least any policy-gradient trainer does: for each micro-batch,
the sampled tokens' log-probs through the same decoder, attention and tiled head as ours (`--bare-head full`: the
whole float32 log-softmax at every position instead, the trainer's old head), a token sum of −logp·A divided
by the batch's action-token count, backward; then gradient clipping and one AdamW step. It gets the micro-batches
already laid out. Our step adds everything else it does each step: group advantages and task
normalization, planning and laying out the packed micro-batches, the PPO ratio with clip and dual clip,
the entropy and clip statistics (and, with --kl-coef, the frozen reference's forward pass, which the bare
step does not have, so it is off by default). After warm-up the two sides alternate, `--repeats` rounds of
`--steps` steps each (ours, bare, ours, bare, ...: `agentrl.bench.repeat`), so that load from other processes
falls on both alike; each round's rate is its median step's, and the ratio is taken within each round. The
ratio of the fastest steps is reported beside it (steadier where other jobs share the cores). Both sides run
in this one process, on `--cpus` with `--threads` torch threads.

Prints a table (median, min-max over the rounds, of each side's tokens/s and of the ratio) and writes it to
--out as JSON with a `machine` record (CPU model, affinity, load before and after, versions, command). The
measurement is `agentrl.bench.trainer_step`.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from agentrl.bench import repeat
from agentrl.bench.trainer_step import StepBench, compare_steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--trajectories", type=int, default=32)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--min-len", type=int, default=64)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--micro-batch-tokens", type=int, default=2048)
    ap.add_argument("--no-packing", action="store_true", help="one padded trajectory per row instead")
    ap.add_argument("--kl-coef", type=float, default=0.0, help="> 0 adds the reference model's forward to ours")
    ap.add_argument("--steps", type=int, default=5, help="timed steps of each side per repeat")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads; on shared cores more than 1 makes step times erratic (OpenMP barriers)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--mixed-precision", default="fp32", choices=["auto", "bf16", "fp32"])
    ap.add_argument("--attn", default="auto", choices=["auto", "sdpa", "varlen", "flex"],
                    help="trainer.attn_implementation of both sides")
    ap.add_argument("--bare-head", default="lean", choices=["lean", "full"],
                    help="the bare step's head: lean (ours: the tiled head on action tokens) | full (every position's "
                         "float32 log-softmax, the trainer's old head)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("runs/bench/trainer.json"))
    repeat.add_args(ap)
    args = ap.parse_args()
    load_before = os.getloadavg()
    cpus = repeat.parse_cpus(args.cpus)
    env = repeat.pin(cpus, args.threads, args.vllm_bind)
    os.environ.update(env)
    torch.set_num_threads(args.threads)
    bench = StepBench(hidden=args.hidden, layers=args.layers, heads=args.heads, vocab=args.vocab,
                      trajectories=args.trajectories, group=args.group, min_len=args.min_len, max_len=args.max_len,
                      micro_batch_tokens=args.micro_batch_tokens, packing=not args.no_packing, kl_coef=args.kl_coef,
                      steps=args.steps, repeats=args.repeats, warmup=args.warmup, device=args.device,
                      mixed_precision=args.mixed_precision, attn_implementation=args.attn, bare_head=args.bare_head,
                      seed=args.seed)
    result = compare_steps(bench)
    result["config"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    result["machine"] = repeat.machine(args.seed, cpus, env, load_before)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(repeat.table(result["repeats"]))
    print(f"ours {result['ours_tokens_per_s']:,.0f} tok/s, bare {result['bare_tokens_per_s']:,.0f} tok/s "
          f"(medians of {args.repeats}), ratio {result['ratio']:.3f} (median of the per-round ratios; overhead "
          f"{100 * result['overhead']:.1f}%; best steps {result['ratio_best_step']:.3f}), "
          f"{result['micro_batches']} micro-batches, padding {100 * result['padding_frac']:.1f}% "
          f"({'packed' if bench.packing else 'padded'}) -> {args.out}")


if __name__ == "__main__":
    main()
