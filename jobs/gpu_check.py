"""GPU check of the trainer: a ~0.5B Qwen2-shaped random model trained with FSDP2 in bf16 by the real RL step
on synthetic batches; prints tokens/s, MFU against the GPU's bf16 peak, peak memory, whether NCCL came up.
Under 5 minutes on one GPU; needs torch, transformers, safetensors (no vLLM). Library: agentrl.trainer.gpu_check.

    python -m jobs.gpu_check                                        # one GPU
    torchrun --nproc-per-node 8 -m jobs.gpu_check                   # 8 GPUs of one node, NCCL
    srun --gpus-per-task=1 --ntasks=8 python -m agentrl.launch.slurm_env -- python -m jobs.gpu_check
    python -m jobs.gpu_check --cpu --tiny                           # CPU, gloo, a tiny model: seconds

Writes the report as JSON to --out (rank 0) as well.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch

from agentrl.trainer.gpu_check import TINY_CHECK, CheckConfig, run_check, start_process_group, summary
from agentrl.trainer.parallel import close_distributed, dist_env, init_distributed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="run on the CPU with gloo (no GPU needed)")
    ap.add_argument("--tiny", action="store_true", help="a tiny model and batch instead of the ~0.5B one")
    ap.add_argument("--steps", type=int, help="timed steps (default 6; tiny 2)")
    ap.add_argument("--trajectories", type=int, help="trajectories per step (default 64, 512-2048 tokens each)")
    ap.add_argument("--micro-batch-tokens", type=int, help="tokens per micro-batch (default 16384)")
    ap.add_argument("--out", type=Path, default=Path("runs/gpu_check.json"))
    args = ap.parse_args(argv)
    check = TINY_CHECK if args.tiny else CheckConfig()
    changes = {k: v for k, v in (("steps", args.steps), ("trajectories", args.trajectories),
                                 ("micro_batch_tokens", args.micro_batch_tokens)) if v is not None}
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
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
        print(f"report: {args.out}")
    return 0 if report["finite"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
