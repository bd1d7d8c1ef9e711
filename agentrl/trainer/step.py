"""One optimizer step: the RL update (advantages → task normalization → PPO) and the SFT warm-start step.

The math comes from `agentrl.algorithms`; this module only arranges it over micro-batches so that the
accumulated gradient equals the gradient of the whole batch's token-mean loss.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from agentrl.algorithms.advantages import ADVANTAGE_ESTIMATORS, token_advantages
from agentrl.algorithms.kl import KL_ESTIMATORS
from agentrl.algorithms.ppo import entropy_from_logits, ppo_loss
from agentrl.algorithms.task_norm import task_normalize
from agentrl.trainer.batch import TrainBatch, micro_batches
from agentrl.trainer.logprobs import token_logprobs


@dataclass(frozen=True)
class RLHyper:
    """The slice of the algorithm config that one update needs."""

    adv_estimator: str = "grpo"
    task_norm: bool = True
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float = 3.0
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    eps: float = 1e-6
    temperature: float = 1.0
    grad_clip: float = 1.0
    micro_batch_tokens: int = 8192


def advantages(batch: TrainBatch, h: RLHyper) -> torch.Tensor:
    """Token advantages [B, T-1]: group estimator, broadcast to action tokens, then per-task normalization."""
    seq_adv = ADVANTAGE_ESTIMATORS[h.adv_estimator](batch.rewards, batch.group_index, eps=h.eps)  # [B]
    adv = token_advantages(seq_adv, batch.mask)  # [B, T-1]
    if h.task_norm:
        adv = task_normalize(adv, batch.mask, batch.task_index, eps=h.eps)
    return adv


def rl_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: TrainBatch, h: RLHyper,
            ref_model: torch.nn.Module | None = None) -> dict[str, float]:
    """Accumulate the PPO gradient over micro-batches, clip, step. Returns scalar statistics."""
    adv = advantages(batch, h)
    total = max(batch.num_action_tokens, 1)
    optimizer.zero_grad(set_to_none=True)
    sums = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "entropy": 0.0, "clipfrac": 0.0, "approx_kl": 0.0}
    for rows in micro_batches(batch, h.micro_batch_tokens):
        mb = batch.select(rows)
        width = mb.mask.shape[1]
        mb_adv = adv[rows, :width]
        n = mb.mask.sum()
        if n == 0:
            continue
        logp, logits = token_logprobs(model, mb.tokens, mb.attention, h.temperature)
        pg, stats = ppo_loss(logp, mb.behaviour_logp, mb_adv, mb.mask, h.eps_low, h.eps_high, h.dual_clip,
                             reduction="token_mean")
        loss = pg
        ent = (entropy_from_logits(logits.detach()) * mb.mask).sum() / n
        if h.entropy_coef:
            loss = loss - h.entropy_coef * (entropy_from_logits(logits) * mb.mask).sum() / n
        kl = torch.zeros(())
        if ref_model is not None and h.kl_coef > 0:
            with torch.no_grad():
                ref_logp, _ = token_logprobs(ref_model, mb.tokens, mb.attention, h.temperature)
            kl = (KL_ESTIMATORS[h.kl_estimator](logp, ref_logp) * mb.mask).sum() / n
            loss = loss + h.kl_coef * kl
        w = float(n) / total  # micro-batch token means → the batch token mean
        (loss * w).backward()
        sums["loss"] += float(loss.detach()) * w
        sums["pg_loss"] += float(pg.detach()) * w
        sums["kl"] += float(kl.detach()) * w
        sums["entropy"] += float(ent.detach()) * w
        sums["clipfrac"] += float(stats["clipfrac"]) * w
        sums["approx_kl"] += float(stats["approx_kl"]) * w
    grad_norm = _clip(model, h.grad_clip)
    skipped = not math.isfinite(grad_norm)
    if skipped:  # never publish weights a NaN/inf gradient touched
        optimizer.zero_grad(set_to_none=True)
    else:
        optimizer.step()
    out = {**sums, "grad_norm": grad_norm, "action_tokens": float(total), "skipped_step": float(skipped)}
    for k, name in enumerate(batch.task_names):
        sel = (batch.task_index[:, None] == k) & (batch.mask > 0)
        if sel.any():
            out[f"adv/{name}/mean"] = float(adv[sel].mean())
            out[f"adv/{name}/std"] = float(adv[sel].std(unbiased=False))
    return out


def sft_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: TrainBatch,
             grad_clip: float, micro_batch_tokens: int, all_tokens: bool = False) -> dict[str, float]:
    """Cross-entropy on action tokens, or on every real token if `all_tokens` (token mean over the batch).

    `sft_token_acc` is measured on the action tokens either way.
    """
    loss_mask = batch.attention[:, 1:].float() if all_tokens else batch.mask  # [B, T-1]
    total = max(float(loss_mask.sum()), 1.0)
    optimizer.zero_grad(set_to_none=True)
    loss_sum, correct = 0.0, 0.0
    for rows in micro_batches(batch, micro_batch_tokens):
        mb = batch.select(rows)
        width = mb.mask.shape[1]
        logp, logits = token_logprobs(model, mb.tokens, mb.attention)
        loss = -(logp * loss_mask[rows, :width]).sum() / total
        loss.backward()
        loss_sum += float(loss.detach())
        correct += float(((logits.argmax(-1) == mb.tokens[:, 1:]).float() * mb.mask).sum())
    grad_norm = _clip(model, grad_clip)
    optimizer.step()
    return {"sft_loss": loss_sum, "sft_token_acc": correct / max(batch.num_action_tokens, 1), "grad_norm": grad_norm}


def _clip(model: torch.nn.Module, grad_clip: float) -> float:
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return 0.0
    if grad_clip > 0:
        return float(torch.nn.utils.clip_grad_norm_(params, grad_clip))
    return float(torch.norm(torch.stack([p.grad.norm() for p in params])))
