"""The RL and SFT losses the trainer must reproduce, written the naive way: one padded forward of the whole batch,
the whole float32 (or float64) log-softmax over the vocabulary, the loss over every action token at once. Tests
compare `rl_step` / `warm_start_step` (tiled head, micro-batches, packing, ranks) against the gradient of these, the tiled
head (`trainer.head`) against `reference_head`, and the trainer's entropy against `entropy_from_logits`."""
from __future__ import annotations

import torch

from agentrl.algorithms.kl import KL_ESTIMATORS
from agentrl.algorithms.ppo import ppo_loss
from agentrl.config import AlgoConfig
from agentrl.trainer.batch import TrainBatch
from agentrl.trainer.logprobs import entropy_from_log_probs, full_vocab_logprobs
from agentrl.trainer.step import advantages


def rl_loss(model: torch.nn.Module, batch: TrainBatch, algo: AlgoConfig, temperature: float,
            ref: torch.nn.Module | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Token mean over the batch of PPO (+ β·KL − c·entropy); and the statistics rl_step reports."""
    logp, log_probs = full_vocab_logprobs(model, batch.tokens, batch.attention, temperature)  # [B, T-1], [..., V]
    m = batch.mask.to(logp.dtype)
    on = m > 0
    total = m.sum()
    adv = advantages(batch, algo).to(logp.dtype)
    pg, _ = ppo_loss(logp, batch.behaviour_logp.to(logp.dtype), adv, m, algo.eps_low, algo.eps_high, algo.dual_clip,
                     reduction="token_sum")
    ent = torch.where(on, entropy_from_log_probs(log_probs), 0.0).sum()
    kl = torch.zeros((), dtype=logp.dtype)
    if ref is not None and algo.kl_coef > 0:
        with torch.no_grad():
            ref_logp, _ = full_vocab_logprobs(ref, batch.tokens, batch.attention, temperature)
        kl = torch.where(on, KL_ESTIMATORS[algo.kl_estimator](logp, ref_logp), 0.0).sum()
    loss = (pg + algo.kl_coef * kl - algo.entropy_coef * ent) / total
    stats = {k: float(v.detach() / total) for k, v in {"loss": loss * total, "pg_loss": pg, "kl": kl, "entropy": ent}.items()}
    return loss, stats


def sft_loss(model: torch.nn.Module, batch: TrainBatch, all_tokens: bool = False) -> tuple[torch.Tensor, float]:
    """Token-mean NLL (action tokens, or every real token) and the argmax accuracy on action tokens."""
    logp, log_probs = full_vocab_logprobs(model, batch.tokens, batch.attention)
    loss_mask = batch.attention[:, 1:] if all_tokens else batch.mask
    nll = -torch.where(loss_mask > 0, logp, 0.0).sum() / loss_mask.sum()
    hit = (log_probs.argmax(-1) == batch.tokens[:, 1:]) & (batch.mask > 0)
    return nll, float(hit.sum()) / float(batch.mask.sum())


def update(model: torch.nn.Module, loss: torch.Tensor, max_norm: float = 0.0) -> dict[str, torch.Tensor]:
    """The first step of SGD (lr 1, any momentum) on `loss`: −grad, clipped to `max_norm` as torch clips."""
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(loss, list(params.values()))
    coef = 1.0
    if max_norm > 0:
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        coef = float(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    step = {n: -g * coef for n, g in zip(params, grads)}
    # the state dict names a tied weight twice; both moved by the same step
    return {n: step[n] if n in step else step[_tied_to(model, n)] for n in model.state_dict()}


def _tied_to(model: torch.nn.Module, name: str) -> str:
    target = dict(model.named_parameters(remove_duplicate=False))[name]
    return next(n for n, p in model.named_parameters() if p is target)


def reference_head(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                   temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What `head_logprobs` must equal: the whole [N, V] float32 log-softmax."""
    logits = torch.nn.functional.linear(hidden, weight, bias)
    logits = logits.double() if logits.dtype == torch.float64 else logits.float()  # [N, V]
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    log_probs = torch.log_softmax(logits, -1)  # [N, V]
    logp = log_probs.gather(-1, targets[:, None]).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logp, entropy, logits.argmax(-1) == targets


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:  # [B, T, V] -> [B, T]
    """Entropy of softmax(logits) over the last dim, stable for −inf logits (masked vocabulary).

    Args:
        logits: [B, T, V] (any leading shape).

    Returns:
        [B, T] entropy in nats.
    """
    x = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()  # bf16/fp16 up
    logp = torch.log_softmax(x, dim=-1)
    p = logp.exp()
    # 0·log 0 = 0; zero the log first so that the backward pass through it stays finite too.
    return -(p * torch.where(p > 0, logp, torch.zeros_like(logp))).sum(dim=-1)
