"""A short check of the trainer on a GPU machine: FSDP2 in bf16, NCCL, and the project's own RL step.

What it is: a Qwen2-shaped model with random weights (Qwen2.5-0.5B's shape by default: ~0.49B parameters)
trained for a few steps by `agentrl.trainer.step.rl_step` on synthetic multi-turn trajectories, sharded with
FSDP2 (`Parallel`, fully_shard per decoder layer, bf16 compute, float32 reduction). It reports what a
person needs before booking a cluster: tokens per second, model FLOPs utilisation against the GPU's dense
bf16 peak, peak memory, and whether the process group's NCCL communicator came up. Entry point:
`python -m jobs.gpu_check` (or `torchrun --nproc-per-node N -m jobs.gpu_check`).

What it is not: a benchmark of the rollout (it needs no vLLM), nor a convergence test (random weights,
random tokens). On one rank it still shards: `Parallel` leaves a single rank unsharded (there is nothing
to shard across), so the check runs a one-rank process group and forces the sharded path, which then
exercises fully_shard, the mixed-precision policy and DTensor gradient clipping exactly as N ranks do.

Needs torch, transformers and safetensors only (safetensors comes with transformers).
"""
from __future__ import annotations

import math
import resource
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from agentrl.trainer.batch import TrainBatch, collate
from agentrl.trainer.parallel import DistEnv, Parallel
from agentrl.trainer.step import RLHyper, rl_step
from agentrl.types import Status, Trajectory, TrajectoryBuilder

# Dense (no sparsity) bf16 tensor-core peaks in FLOP/s, from the vendors' data sheets; matched as substrings
# of torch.cuda.get_device_name(), first match wins (the more specific names come first).
BF16_PEAK_FLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("GH200", 989e12),
    ("H200", 989e12),
    ("H100", 989e12),   # SXM ("H100 80GB HBM3")
    ("H800", 989e12),
    ("H20", 148e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("A10G", 70e12),
    ("L4", 121e12),
    ("MI300X", 1307e12),
)


def bf16_peak(device_name: str) -> float | None:
    """The dense bf16 peak of a device by its name, or None when it is not in the table."""
    for key, peak in BF16_PEAK_FLOPS:
        if key in device_name:
            return peak
    return None


@dataclass(frozen=True)
class ModelShape:
    """A Qwen2 decoder's shape. The default is Qwen2.5-0.5B's (tied embeddings, grouped-query attention)."""

    hidden: int = 896
    layers: int = 24
    heads: int = 14
    kv_heads: int = 2
    intermediate: int = 4864
    vocab: int = 151936
    max_len: int = 4096


TINY = ModelShape(hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128, vocab=512, max_len=256)


@dataclass(frozen=True)
class CheckConfig:
    shape: ModelShape = field(default_factory=ModelShape)
    trajectories: int = 64
    group: int = 8
    min_len: int = 512
    max_len: int = 2048
    micro_batch_tokens: int = 16384
    steps: int = 6
    warmup: int = 2
    seed: int = 0


TINY_CHECK = CheckConfig(shape=TINY, trajectories=8, group=4, min_len=24, max_len=96, micro_batch_tokens=256,
                         steps=2, warmup=1)


def train_flops(n_params: int, layers: int, hidden: int, lengths: list[int]) -> float:
    """Model FLOPs of one forward + backward over sequences of `lengths` tokens.

    6·N per token for the matrix multiplies (N counts the tied head once: it is used once as a matmul), plus
    causal attention, per layer and sequence of length S, 2·S²·d for the scores and 2·S²·d for the weighted
    values, halved by the causal mask and tripled for forward + backward: 6·L·d·S² (PaLM's accounting,
    appendix B, with the causal half). Packed sequences attend within themselves only, so S is each one's."""
    return float(sum(6 * n_params * s + 6 * layers * hidden * s * s for s in lengths))


def synthetic_trajectories(n: int, group: int, min_len: int, max_len: int, vocab: int, seed: int) -> list[Trajectory]:
    """Multi-turn trajectories (alternating observation and action segments, about half the tokens actions,
    behaviour log-probs in [-3, 0]); rewards 0/1 within GRPO groups of `group`. Every rank draws the same."""
    rng = np.random.default_rng(seed)
    out = []
    for j in range(n):
        target = int(rng.integers(min_len, max_len + 1))
        b = TrajectoryBuilder()
        while len(b) < target:
            b.add_context(rng.integers(0, vocab, int(min(rng.integers(8, 64), target - len(b)))).tolist())
            act = int(min(rng.integers(8, 64), target - len(b)))
            if act > 0:
                b.add_action(rng.integers(0, vocab, act).tolist(), (-rng.random(act) * 3).tolist(), 0, 0)
        out.append(b.build(traj_id=str(j), task="check", index=str(j // group), group_id=str(j // group),
                           reward=float(rng.integers(0, 2)), status=Status.COMPLETED, num_turns=1))
    return out


class ShardedAlone(Parallel):
    """`Parallel` with FSDP2 on a one-rank process group (see the module docstring)."""

    @property
    def sharded(self) -> bool:
        return self.kind == "fsdp2"


def start_process_group(env: DistEnv, device: torch.device) -> None:
    """A one-rank group (an in-memory store, no port) when the launcher started one rank; `init_distributed`
    has made the group already when it started more."""
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                                world_size=1)


def nccl_status(device: torch.device) -> dict[str, Any]:
    """Whether the group's NCCL communicator works: one all-reduce of ones must sum to the world size
    (NCCL makes its communicator lazily, at the first collective)."""
    if dist.get_backend() != "nccl":
        return {"nccl": "not used", "backend": dist.get_backend()}
    try:
        x = torch.ones(1, device=device)
        dist.all_reduce(x)
        torch.cuda.synchronize(device)
        ok = int(x.item()) == dist.get_world_size()
        version = ".".join(str(v) for v in torch.cuda.nccl.version())
        return {"nccl": "initialised" if ok else f"all_reduce gave {x.item()}", "nccl_version": version,
                "backend": "nccl"}
    except Exception as e:  # the report says what failed instead of a traceback on every rank
        return {"nccl": f"failed: {type(e).__name__}: {e}", "backend": "nccl"}


def build_model(shape: ModelShape, device: torch.device, seed: int) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)  # every rank builds the same weights before sharding
    cfg = Qwen2Config(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                      num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                      num_key_value_heads=shape.kv_heads, max_position_embeddings=shape.max_len,
                      tie_word_embeddings=True)
    with torch.device(device):  # random init straight on the GPU: seconds instead of a minute on the CPU
        return Qwen2ForCausalLM(cfg)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_check(check: CheckConfig, env: DistEnv, device: torch.device) -> dict[str, Any]:
    """Train `check.steps` timed RL steps (after `check.warmup`) and return the report (the same on every
    rank except the memory figures, which are this rank's). The process group must exist (see
    `start_process_group`)."""
    par_cls = ShardedAlone if env.world_size == 1 else Parallel
    par = par_cls("fsdp2", env, device, "bf16")
    nccl = nccl_status(device)
    s = check.shape
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    model = build_model(s, device, check.seed)
    n_params = sum(p.numel() for p in model.parameters())
    model = par.wrap(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    trajs = synthetic_trajectories(check.trajectories, check.group, check.min_len, check.max_len, s.vocab, check.seed)
    batch: TrainBatch = collate(trajs, [t.reward for t in trajs], pad_id=0)
    h = RLHyper(micro_batch_tokens=check.micro_batch_tokens, packing=True, kl_coef=0.0)
    setup_s = time.perf_counter() - t0
    times, stats = [], {}
    for i in range(check.warmup + check.steps):
        _sync(device)
        t = time.perf_counter()
        stats = rl_step(model, opt, batch, h, None, par)
        _sync(device)
        if i >= check.warmup:
            times.append(time.perf_counter() - t)
    step_s = statistics.median(times)
    tokens = sum(batch.lengths)
    flops = train_flops(n_params, s.layers, s.hidden, list(batch.lengths))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = bf16_peak(name) if device.type == "cuda" else None
    report: dict[str, Any] = {
        "device": name, "world_size": env.world_size, "params": n_params, "tokens_per_step": tokens,
        "micro_batches": int(stats["micro_batches"]), "step_s": times, "step_s_median": step_s,
        "tokens_per_s": tokens / step_s, "tokens_per_s_per_rank": tokens / step_s / env.world_size,
        "model_tflops_per_step": flops / 1e12, "achieved_tflops_per_rank": flops / step_s / env.world_size / 1e12,
        "bf16_peak_tflops": peak / 1e12 if peak else None,
        "mfu": flops / step_s / (peak * env.world_size) if peak else None,
        "loss": stats["loss"], "grad_norm": stats["grad_norm"], "finite": math.isfinite(stats["loss"])
        and math.isfinite(stats["grad_norm"]), "setup_s": setup_s, "torch": torch.__version__, **nccl,
        "host_peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }
    if device.type == "cuda":
        report["gpu_peak_allocated_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        report["gpu_peak_reserved_gib"] = torch.cuda.max_memory_reserved(device) / 2**30
        report["gpu_total_gib"] = torch.cuda.get_device_properties(device).total_memory / 2**30
    return report


def summary(r: dict[str, Any]) -> str:
    """The report as the few lines a person reads."""
    mfu = (f"{100 * r['mfu']:.1f}% of {r['bf16_peak_tflops']:.0f} TFLOP/s dense bf16 per GPU" if r["mfu"] is not None
           else f"unknown: no bf16 peak known for {r['device']!r} (agentrl/trainer/gpu_check.py BF16_PEAK_FLOPS)")
    mem = (f"GPU peak {r['gpu_peak_allocated_gib']:.1f} GiB allocated, {r['gpu_peak_reserved_gib']:.1f} GiB reserved "
           f"of {r['gpu_total_gib']:.0f} GiB" if "gpu_peak_allocated_gib" in r else "no GPU")
    return "\n".join([
        f"device {r['device']} x {r['world_size']}, torch {r['torch']}, {r['params'] / 1e6:.0f}M parameters "
        f"(FSDP2, bf16), {r['tokens_per_step']} tokens per step in {r['micro_batches']} micro-batches",
        f"step {r['step_s_median']:.3f} s (median), {r['tokens_per_s']:,.0f} tokens/s "
        f"({r['tokens_per_s_per_rank']:,.0f} per rank), {r['achieved_tflops_per_rank']:.1f} TFLOP/s per rank",
        f"MFU {mfu}",
        f"memory: {mem}; host peak RSS {r['host_peak_rss_gib']:.1f} GiB (this rank)",
        f"nccl: {r['nccl']}" + (f" (NCCL {r['nccl_version']})" if "nccl_version" in r else f" ({r['backend']})"),
        f"loss {r['loss']:.4f}, grad norm {r['grad_norm']:.3f}, finite: {r['finite']}; set-up {r['setup_s']:.1f} s",
    ])
