"""One RL step with the whole-vocabulary head (the trainer's old head) against the tiled head (`trainer.head`),
measured in a fresh process each: peak RSS and seconds (`jobs.bench_trainer_head` runs the sides interleaved).

The baseline side, `full_vocab_rl_step`, is the old step kept whole: every position's logits in the compute dtype,
upcast to float32, `log_softmax` over the vocabulary ([R, L-1, V] float32, kept by autograd), the gather, the
entropy statistic from the log-softmax at the action tokens, PPO's token sum, backward; then clipping and the
optimizer step. The lean side is `trainer.step.rl_step` as the trainer runs it. Both see the same model, batch,
layout and parallel setting (FSDP2 on a one-rank group with bf16 compute, as `jobs.gpu_check` runs, or one plain
float32 process).
"""
from __future__ import annotations

import math
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentrl.config import AlgoConfig, TrainerConfig
from agentrl.trainer.batch import MicroBatch, TrainBatch, collate, layout, plan_micro_batches
from agentrl.trainer.gpu_check import ShardedAlone, build_model, start_process_group, synthetic_trajectories
from agentrl.trainer.logprobs import entropy_from_log_probs, full_vocab_logprobs
from agentrl.trainer.memory import Shape
from agentrl.trainer.parallel import DistEnv, Parallel, close_distributed
from agentrl.trainer.step import PG_LOSSES, advantages, rl_step


@dataclass(frozen=True)
class HeadBench:
    """The issue's shape by default: a Qwen2-shaped model of hidden 64 and 2 layers with Qwen2.5's 151,936-token
    vocabulary (tied), 4,096 tokens in one micro-batch (8 trajectories of 512, about a third action tokens)."""

    hidden: int = 64
    layers: int = 2
    vocab: int = 151936
    tokens: int = 4096
    trajectories: int = 8
    parallel: str = "fsdp2"
    """fsdp2: one-rank FSDP2 with bf16 compute (`gpu_check`'s setting, where the 7.45 GiB was seen) | none: fp32."""
    seed: int = 0


def _rows(mb: MicroBatch, grid: torch.Tensor) -> torch.Tensor:  # [K, C] target grid → [R, L-1], zeros elsewhere
    R, L = mb.tokens.shape
    vals = grid.reshape(-1)[mb.dest]
    return vals.new_zeros(R * L).index_copy(0, mb.select, vals).view(R, L)[:, :-1]


def full_vocab_rl_step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: TrainBatch, algo: AlgoConfig,
                       trainer: TrainerConfig, temperature: float, par: Parallel) -> dict[str, float]:
    """The old rl_step (no KL): the whole float32 log-softmax per micro-batch. Returns loss and grad_norm."""
    adv = advantages(batch, algo)
    total = max(batch.num_action_tokens, 1)
    per_target = {"mask": batch.mask, "behaviour_logp": batch.behaviour_logp, "adv": adv}
    opt.zero_grad(set_to_none=True)
    loss_sum = 0.0
    for rows in plan_micro_batches(batch.lengths, trainer.micro_batch_tokens, trainer.packing):
        mb = layout(batch, rows, per_target, trainer.packing).to(par.device)
        t = {k: _rows(mb, v) for k, v in mb.targets.items()}  # [R, L-1] each, as the old layout made them
        with par.autocast():
            logp, log_probs = full_vocab_logprobs(model, mb.tokens, mb.attention, temperature, mb.position_ids)
            on = t["mask"] > 0
            pg_sum, _ = PG_LOSSES[algo.offpolicy](logp, t["behaviour_logp"], t["adv"], t["mask"], algo)
            with torch.no_grad():
                entropy_from_log_probs(log_probs[on]).sum()  # the statistic the old step computed
        (pg_sum / total * par.grad_scale).backward()
        loss_sum += float(pg_sum.detach())
    grad_norm = par.clip_grad_norm(model.parameters(), trainer.grad_clip)
    opt.step()
    return {"loss": loss_sum / total, "grad_norm": grad_norm}


def _rss_gib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def _peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def measure(side: str, b: HeadBench) -> dict[str, Any]:
    """One step of `side` (full | lean) in this process, which must be fresh (peak RSS is the process's)."""
    device = torch.device("cpu")
    shape = Shape(hidden=b.hidden, layers=b.layers, heads=2, kv_heads=1, intermediate=2 * b.hidden, vocab=b.vocab,
                  tied=True)
    env = DistEnv()
    if b.parallel == "fsdp2":
        start_process_group(env, device)
        par: Parallel = ShardedAlone("fsdp2", env, device, "bf16")
    else:
        par = Parallel("none", env, device, "fp32")
    try:
        model = par.wrap(build_model(shape, device, b.seed, max(4096, b.tokens)))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
        n = b.tokens // b.trajectories
        trajs = synthetic_trajectories(b.trajectories, b.trajectories, n, n, b.vocab, b.seed)
        batch = collate(trajs, [t.reward for t in trajs], pad_id=0)
        algo, trainer = AlgoConfig(kl_coef=0.0), TrainerConfig(micro_batch_tokens=b.tokens, packing=True)
        assert len(plan_micro_batches(batch.lengths, trainer.micro_batch_tokens, True)) == 1
        before, peak_before = _rss_gib(), _peak_gib()
        t0 = time.perf_counter()
        stats = rl_step(model, opt, batch, algo, trainer, 1.0, None, par) if side == "lean" else \
            full_vocab_rl_step(model, opt, batch, algo, trainer, 1.0, par)
        step_s = time.perf_counter() - t0
    finally:
        close_distributed()
    peak = _peak_gib()
    return {"peak_rss_gib": peak, "rss_before_step_gib": before, "peak_before_step_gib": peak_before,
            "step_rss_increase_gib": peak - before, "step_s": step_s, "loss": stats["loss"],
            "grad_norm": stats["grad_norm"], "finite": math.isfinite(stats["loss"]),
            "tokens": sum(batch.lengths), "action_tokens": batch.num_action_tokens,
            "threads": torch.get_num_threads()}
