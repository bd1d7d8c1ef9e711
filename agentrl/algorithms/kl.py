"""Per-token KL estimators (Schulman, "Approximating KL Divergence", 2020).

Each estimates KL(π_θ ‖ π_ref) from tokens sampled by π_θ, given the two log-probs of each token.
With log r = log π_ref − log π_θ:

    k1 = −log r                 unbiased, high variance, can be negative
    k2 = ½ (log r)²             biased (low for close policies), always ≥ 0
    k3 = (r − 1) − log r        unbiased, always ≥ 0, low variance (the paper's choice, docs/architecture.md §5)

The functions are per token and do not mask or reduce: the caller masks with the loss mask and reduces
with the same reduction as the policy loss (`ppo.LOSS_REDUCTIONS`). No clamping is done; a caller that
fears overflow of exp(log r) in k3 clamps log r itself.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def kl_k1(
    logp: Tensor,  # [B, T] log π_θ of the sampled tokens
    ref_logp: Tensor,  # [B, T] log π_ref of the same tokens
) -> Tensor:  # [B, T]
    """k1 = log π_θ − log π_ref per token.

    Args:
        logp: [B, T] policy log-probs (any shape; elementwise).
        ref_logp: same shape, reference log-probs.

    Returns:
        Same shape, the per-token estimate.
    """
    return logp - ref_logp


def kl_k2(
    logp: Tensor,  # [B, T]
    ref_logp: Tensor,  # [B, T]
) -> Tensor:  # [B, T]
    """k2 = ½ (log π_ref − log π_θ)² per token. Args and Returns as `kl_k1`."""
    return 0.5 * (ref_logp - logp).pow(2)


def kl_k3(
    logp: Tensor,  # [B, T]
    ref_logp: Tensor,  # [B, T]
) -> Tensor:  # [B, T]
    """k3 = exp(log r) − 1 − log r with log r = log π_ref − log π_θ, per token. Args and Returns as `kl_k1`."""
    log_r = ref_logp - logp
    return torch.expm1(log_r) - log_r


KLEstimator = Callable[[Tensor, Tensor], Tensor]

KL_ESTIMATORS: dict[str, KLEstimator] = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}
