"""Off-policy corrections for asynchronous rollout (docs/architecture.md §6): decoupled PPO and truncated importance
sampling.

Three policies meet in an asynchronous batch: μ, the engine(s) that sampled each token (its log-probs
travel with the trajectory, one version per token); π_prox, the proximal policy the update is anchored to
(the trainer's weights before this step); π_θ, the policy being trained. Decoupled PPO (Hilton et al.
2022; AReaL) clips the trust region against π_prox and corrects for sampling by μ with a constant weight:

    r_t = π_θ / π_prox          ρ_t = π_prox / μ        (ρ_t is a constant: no gradient)
    ℓ_t = w(ρ)_t · max(−A_t r_t, −A_t clip(r_t, 1 − ε_low, 1 + ε_high)),   dual clip as in `ppo.ppo_loss`

`w` is picked from `BEHAVIOUR_WEIGHTS`: truncated IS min(ρ, C) (the default, and the correction slime and
verl call TIS for engine–trainer mismatch: with π_prox recomputed by the trainer from the weights that
sampled, ρ is exactly the numerical mismatch between engine and trainer), rejection (ρ outside
[low, high] → weight 0, the token still counts in the denominator), a sequence-level truncated geometric
mean, or "none" (w ≡ 1: AReaL's default, kept only to measure what the correction buys).

Where π_prox comes from: the pre-update weights. With one optimizer step per batch that is the trainer's
current weights, so an exact π_prox is simply `logp.detach()` and costs no extra pass. AReaL's approximation
of π_prox (interpolating between μ and π_θ in version space) is not implemented: it saves a forward pass only
where several optimizer steps share one batch, and the trainer takes one.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from agentrl.algorithms.ppo import masked_mean, ppo_loss


def _log_rho(prox_logp: Tensor, behaviour_logp: Tensor, mask: Tensor) -> Tensor:  # [B, T], 0 where mask 0
    m = mask.bool()
    zero = torch.zeros_like(prox_logp)
    lr = torch.where(m, prox_logp.detach(), zero) - torch.where(m, behaviour_logp.detach().to(zero.dtype), zero)
    return torch.where(torch.isfinite(lr), lr, zero)  # a −inf behaviour log-prob (engine clamp) → weight 1


def weight_none(prox_logp: Tensor, behaviour_logp: Tensor, mask: Tensor, low: float, high: float) -> Tensor:
    """w ≡ 1 on action tokens: no behaviour correction."""
    return mask.bool().to(prox_logp.dtype)


def weight_truncate(prox_logp: Tensor, behaviour_logp: Tensor, mask: Tensor, low: float, high: float) -> Tensor:
    """w = clip(ρ, low, high) per token (truncated IS; low = 0 is plain truncation at `high`)."""
    w = torch.exp(_log_rho(prox_logp, behaviour_logp, mask)).clamp(min=low, max=high)
    return torch.where(mask.bool(), w, torch.zeros_like(w)).to(prox_logp.dtype)


def weight_mask(prox_logp: Tensor, behaviour_logp: Tensor, mask: Tensor, low: float, high: float) -> Tensor:
    """w = ρ where low ≤ ρ ≤ high, else 0 (rejection: the token stays in the loss denominator)."""
    rho = torch.exp(_log_rho(prox_logp, behaviour_logp, mask))
    keep = mask.bool() & (rho >= low) & (rho <= high)
    return torch.where(keep, rho, torch.zeros_like(rho)).to(prox_logp.dtype)


def weight_seq_truncate(prox_logp: Tensor, behaviour_logp: Tensor, mask: Tensor, low: float, high: float) -> Tensor:
    """w = clip(exp(mean_t log ρ_t), low, high) for every action token of a sequence (geometric mean)."""
    log_rho = _log_rho(prox_logp, behaviour_logp, mask)
    seq = torch.exp(masked_mean(log_rho, mask, dim=1)).clamp(min=low, max=high)  # [B]
    w = seq[:, None].expand_as(log_rho)
    return torch.where(mask.bool(), w, torch.zeros_like(w)).to(prox_logp.dtype)


BehaviourWeight = Callable[[Tensor, Tensor, Tensor, float, float], Tensor]
BEHAVIOUR_WEIGHTS: dict[str, BehaviourWeight] = {
    "truncate": weight_truncate, "mask": weight_mask, "seq_truncate": weight_seq_truncate, "none": weight_none,
}


def decoupled_ppo_loss(
    logp: Tensor,  # [B, T] log π_θ (requires grad)
    prox_logp: Tensor,  # [B, T] log π_prox (the pre-update weights' log-probs)
    behaviour_logp: Tensor,  # [B, T] log μ, from the engines
    adv: Tensor,  # [B, T] token advantages
    mask: Tensor,  # [B, T] loss mask
    eps_low: float,
    eps_high: float,
    dual_clip: float = 0.0,
    weight: str = "truncate",
    is_low: float = 0.0,
    is_high: float = 2.0,
    reduction: str = "token_mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """Decoupled PPO: clip against π_prox, reweight each token by w(π_prox / μ) (module docstring).

    Args:
        logp, prox_logp, behaviour_logp, adv, mask: [B, T]; masked positions may hold anything.
        eps_low, eps_high, dual_clip, reduction: as in `ppo.ppo_loss`.
        weight: a key of `BEHAVIOUR_WEIGHTS`.
        is_low, is_high: bounds of the behaviour weight (`high` is the truncation cap C).

    Returns:
        (loss, stats): `ppo.ppo_loss`'s stats for r = π_θ/π_prox, plus `is_weight_mean` (mean w over action
        tokens), `is_zero_frac` (fraction of action tokens with w = 0), `behaviour_kl` (k3 estimate of
        KL(μ ‖ π_prox) from log ρ: how far off-policy the batch is).
    """
    if is_high <= 0 or is_low < 0 or is_low > is_high:
        raise ValueError(f"need 0 <= is_low <= is_high and is_high > 0, got {is_low}, {is_high}")
    w = BEHAVIOUR_WEIGHTS[weight](prox_logp, behaviour_logp, mask, is_low, is_high).to(logp.dtype)  # [B, T]
    m = mask.bool()
    # The clipped surrogate is positively homogeneous in A, so w·ℓ(A) = ℓ(w·A) for w ≥ 0, dual clip included.
    loss, stats = ppo_loss(logp, prox_logp.detach(), torch.where(m, adv.to(logp.dtype), 0.0) * w, mask,
                           eps_low, eps_high, dual_clip=dual_clip, reduction=reduction)
    with torch.no_grad():
        log_rho = _log_rho(prox_logp, behaviour_logp, mask)
        stats["is_weight_mean"] = masked_mean(w, m)
        stats["is_zero_frac"] = masked_mean((w == 0).to(w.dtype), m)
        stats["behaviour_kl"] = masked_mean(torch.expm1(-log_rho) + log_rho, m)  # μ samples: log(μ/π_prox)
    return loss, stats


def tis_ppo_loss(
    logp: Tensor,  # [B, T] log π_θ (requires grad)
    old_logp: Tensor,  # [B, T] the trainer's recomputation of the sampling policy
    behaviour_logp: Tensor,  # [B, T] the engine's log-probs of the same tokens
    adv: Tensor,  # [B, T]
    mask: Tensor,  # [B, T]
    eps_low: float,
    eps_high: float,
    dual_clip: float = 0.0,
    cap: float = 2.0,
    reduction: str = "token_mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO against the trainer's own log-probs, times min(π_old / μ, cap): truncated IS for the mismatch
    between engine and trainer numerics (bf16 kernels, sampling) on one set of weights. The same
    arithmetic as `decoupled_ppo_loss` with weight "truncate"; named for what the caller passes."""
    if not math.isfinite(cap) or cap <= 0:
        raise ValueError(f"cap must be a positive number, got {cap}")
    return decoupled_ppo_loss(logp, old_logp, behaviour_logp, adv, mask, eps_low, eps_high, dual_clip=dual_clip,
                              weight="truncate", is_low=0.0, is_high=cap, reduction=reduction)
