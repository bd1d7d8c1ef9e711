"""The clipped policy loss with dual clip (docs/architecture.md §5 step 4), and its reductions. (Token
entropy is the trainer's, computed with the log-probs by `trainer.head`.)

Per action token, with ratio = exp(logp − behaviour_logp):

    loss = max(−A·ratio, −A·clip(ratio, 1 − eps_low, 1 + eps_high))      (PPO, pessimistic)
    loss = min(loss, −c·A)   for A < 0, when dual_clip c > 1           (dual clip, Ye et al. 2020)

The dual clip caps the loss of a negative-advantage token whose ratio has run far above 1, so one
stale, very unlikely token cannot dominate the batch. The KL penalty to a frozen reference is not
here: the trainer adds β · reduce(kl.KL_ESTIMATORS[...](logp, ref_logp), mask) with a reduction from
`LOSS_REDUCTIONS`. Masked positions may hold any value (even ±inf): inputs are replaced by 0 there
before any arithmetic, so their gradients are exactly 0.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from agentrl.algorithms.kl import kl_k3


def masked_mean(
    x: Tensor,  # [B, T]
    mask: Tensor,  # [B, T]
    dim: int | None = None,
) -> Tensor:
    """Mean of `x` over positions where `mask` is nonzero; 0 where there are none.

    Args:
        x: values, any shape.
        mask: same shape, nonzero where `x` counts.
        dim: reduce over this dim only (e.g. 1 for a per-sequence mean [B]); all dims if None.

    Returns:
        Scalar, or `x` reduced over `dim`.
    """
    m = mask.bool()
    total = torch.where(m, x, torch.zeros_like(x))
    if dim is None:
        return total.sum() / m.sum().clamp(min=1)
    return total.sum(dim) / m.sum(dim).clamp(min=1)


def token_mean(loss: Tensor, mask: Tensor) -> Tensor:  # loss, mask: [B, T] -> scalar
    """Sum over all action tokens of the batch / number of action tokens (0 if none)."""
    return masked_mean(loss, mask)


def token_sum(loss: Tensor, mask: Tensor) -> Tensor:  # [B, T] -> scalar
    """Sum over all action tokens, for callers that divide by a global token count themselves (the
    token mean of a batch split over micro-batches and data-parallel ranks)."""
    return torch.where(mask.bool(), loss, torch.zeros_like(loss)).sum()


def seq_mean(loss: Tensor, mask: Tensor) -> Tensor:  # [B, T] -> scalar
    """Mean over tokens within each sequence, then over sequences with ≥ 1 action token (0 if none)."""
    per_seq = masked_mean(loss, mask, dim=1)  # [B]
    return masked_mean(per_seq, mask.bool().any(dim=1))


def seq_sum(loss: Tensor, mask: Tensor) -> Tensor:  # [B, T] -> scalar
    """Sum over sequences of each sequence's token mean; the caller divides by a global sequence count."""
    return masked_mean(loss, mask, dim=1).sum()


Reduction = Callable[[Tensor, Tensor], Tensor]

LOSS_REDUCTIONS: dict[str, Reduction] = {
    "token_mean": token_mean,
    "seq_mean": seq_mean,
    "token_sum": token_sum,
    "seq_sum": seq_sum,
}


def ppo_loss(
    logp: Tensor,  # [B, T] log π_θ of the sampled tokens (requires grad)
    behaviour_logp: Tensor,  # [B, T] log-probs of the engine that sampled them
    adv: Tensor,  # [B, T] token advantages
    mask: Tensor,  # [B, T] loss mask
    eps_low: float,
    eps_high: float,
    dual_clip: float = 0.0,
    reduction: str = "token_mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate loss with optional dual clip, reduced over action tokens.

    Args:
        logp: [B, T] current-policy log-probs.
        behaviour_logp: [B, T] behaviour log-probs (or proximal ones, for decoupled PPO; see
            `offpolicy.decoupled_ppo_loss`).
        adv: [B, T] advantages (after task normalization).
        mask: [B, T] loss mask, nonzero on action tokens.
        eps_low: ratio lower clip is 1 − eps_low.
        eps_high: ratio upper clip is 1 + eps_high (clip-higher when > eps_low).
        dual_clip: c > 1 caps the loss of negative-advantage tokens at −c·A; 0 disables.
        reduction: a key of `LOSS_REDUCTIONS`.

    Returns:
        (loss scalar, stats). Stats are detached scalars over action tokens: `clipfrac` (fraction where
        the clipped term is selected, i.e. the gradient is cut by the clip), `dual_clipfrac` (fraction
        where the dual-clip cap is selected), `approx_kl` (mean k3 estimate of KL(π_behaviour ‖ π_θ),
        (ratio − 1) − log ratio, unbiased under behaviour samples), `ratio_mean`, `ratio_max` (0 if the
        batch has no action token).
    """
    if dual_clip != 0.0 and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 or 0 (disabled), got {dual_clip}")
    reduce = LOSS_REDUCTIONS[reduction]
    m = mask.bool()
    zero = torch.zeros_like(logp)
    log_ratio = torch.where(m, logp, zero) - torch.where(m, behaviour_logp.to(logp.dtype), zero)  # [B, T]
    a = torch.where(m, adv.to(logp.dtype), zero)  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    unclipped = -a * ratio
    clipped = -a * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    per_token = torch.maximum(unclipped, clipped)  # [B, T]
    is_clipped = clipped > unclipped  # [B, T]
    is_dual = torch.zeros_like(m)
    if dual_clip > 0.0:
        cap = -dual_clip * a
        is_dual = (a < 0) & (per_token > cap)
        per_token = torch.where(is_dual, cap, per_token)
    loss = reduce(per_token, m)
    with torch.no_grad():
        r = ratio.detach()
        stats = {
            "clipfrac": masked_mean(is_clipped.to(r.dtype), m),
            "dual_clipfrac": masked_mean(is_dual.to(r.dtype), m),
            "approx_kl": masked_mean(kl_k3(zero, log_ratio.detach()), m),  # π_b samples: log r = log ratio
            "ratio_mean": masked_mean(r, m),
            "ratio_max": torch.where(m, r, torch.zeros_like(r)).max() if m.any() else r.new_zeros(()),
        }
    return loss, stats

