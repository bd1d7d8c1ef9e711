"""GPU check of the trainer, the check a site runs first: a Qwen2-shaped random model (Qwen2.5's shapes or any
config.json) trained with FSDP2 in bf16 by the real RL step on synthetic batches, its steps interleaved with the bare
step's; prints tokens/s, MFU against the GPU's bf16 peak (the FLOPs the step must do), ours/bare, the memory model's
figure per component beside the measured one, whether NCCL came up; writes one JSON per run. Under 4 minutes on
one H200 for 0.5b and 3b; needs torch, transformers, safetensors (no vLLM). Library: agentrl.trainer.gpu_check.

    python -m jobs.gpu_check                                             # 0.5b, 16k-token micro-batches, one GPU
    python -m jobs.gpu_check --preset agentbench-qwen2.5-3b              # the preset's shape and trainer settings
    python -m jobs.gpu_check --shape 3b --micro-batch-tokens 16384 --activation-checkpointing on --attn varlen
    python -m jobs.gpu_check --shape /models/Qwen2.5-7B-Instruct/config.json --activation-checkpointing on
    torchrun --nproc-per-node 8 -m jobs.gpu_check --shape 7b             # 8 GPUs of one node, NCCL
    srun --gpus-per-task=1 --ntasks=8 python -m agentrl.launch.slurm_env -- python -m jobs.gpu_check --shape 7b
    python -m jobs.gpu_check --cpu --tiny                                # CPU, gloo, a tiny model: seconds

The JSON goes to --out (default runs/gpu_check/<shape>-<tokens>-<attention>-ckpt<on|off>.json, rank 0).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch

from agentrl.config import load_config
from agentrl.trainer.gpu_check import (
    TINY_CHECK,
    CheckConfig,
    run_check,
    shape_of,
    start_process_group,
    summary,
    with_preset,
)
from agentrl.trainer.parallel import close_distributed, dist_env, init_distributed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="run on the CPU with gloo (no GPU needed)")
    ap.add_argument("--tiny", action="store_true", help="a tiny model and batch (the same as --shape tiny)")
    ap.add_argument("--shape", help="0.5b (default) | 1.5b | 3b | 7b | 14b | 32b | tiny | a config.json")
    ap.add_argument("--preset", help="take the micro-batch tokens, activation checkpointing and attention of this "
                                     "preset (and its shape from its name, e.g. agentbench-qwen2.5-3b → 3b)")
    ap.add_argument("--micro-batch-tokens", type=int, help="tokens per micro-batch (default 16384)")
    ap.add_argument("--attn", choices=["auto", "sdpa", "varlen", "flex"], help="trainer.attn_implementation")
    ap.add_argument("--activation-checkpointing", choices=["on", "off"])
    ap.add_argument("--steps", type=int, help="timed steps of each side per round (default 2)")
    ap.add_argument("--repeats", type=int, help="rounds, ours then bare (default 3)")
    ap.add_argument("--trajectories", type=int, help="trajectories per step (default 64, 512-2048 tokens each)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    check = TINY_CHECK if args.tiny or args.shape == "tiny" else CheckConfig()
    shape = args.shape
    if args.preset:
        check = with_preset(check, load_config(args.preset))
        shape = shape or args.preset.rsplit("-", 1)[-1]
    if shape and shape != "tiny":
        check = dataclasses.replace(check, shape=shape_of(shape), shape_name=Path(shape).parent.name or shape)
    changes = {k: v for k, v in (("steps", args.steps), ("repeats", args.repeats), ("trajectories", args.trajectories),
                                 ("micro_batch_tokens", args.micro_batch_tokens), ("attn", args.attn)) if v is not None}
    if args.activation_checkpointing:
        changes["checkpointing"] = args.activation_checkpointing == "on"
    check = dataclasses.replace(check, **changes)
    if not args.cpu and not torch.cuda.is_available():
        ap.error("no CUDA device here: pass --cpu (with --tiny for a quick run)")
    env = dist_env()
    if args.cpu:
        torch.set_num_threads(1)
        device = torch.device("cpu")
        if env.world_size > 1:
            init_distributed(env, backend="gloo")
    else:
        device = init_distributed(env)  # NCCL on more than one rank; cuda:LOCAL_RANK (or the one bound GPU)
    start_process_group(env, device)
    try:
        report = run_check(check, env, device)
    finally:
        close_distributed()
    if env.rank == 0:
        print(summary(report), flush=True)
        tag = f"{report['attention']}-ckpt{'on' if check.checkpointing else 'off'}{'-cpu' if args.cpu else ''}"
        out = args.out or Path("runs/gpu_check") / f"{check.shape_name}-{check.micro_batch_tokens}-{tag}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"check": dataclasses.asdict(check), **report}, indent=2, default=str))
        print(f"report: {out}")
    return 0 if report["finite"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
