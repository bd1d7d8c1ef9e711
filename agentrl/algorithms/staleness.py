"""Staleness of off-policy trajectories and truncated importance weights (docs/architecture.md §5 steps 5–6).

With asynchronous rollout and cross-policy sampling, each action token records the policy version
that sampled it. A trajectory's staleness is how many versions its *oldest* action token is behind
the trainer; the trainer drops trajectories staler than `max_staleness` (and counts them).

`truncated_is_weights` gives the per-token weight π_prox/π_behaviour truncated at `bound`, for
decoupled PPO (Hilton et al. 2022; AReaL): with proximal log-probs recomputed by the trainer, the loss
is `ppo_loss(logp, logp_prox, adv * w, mask, ...)`. Because the clipped surrogate is linear in the
advantage and w > 0, scaling the advantage is the same as scaling each token's loss by w.

The one staleness rule, per trajectory, for everything that filters or bounds by it: the trainer's queue
(`transport.queue`, on arrival and at each new version), the step's selection (`trainer.select`), a rollout
rank's admission (`admit_limit`, `rollout.role.RolloutLoop`) and the planner that models them (`bench.planner`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from agentrl.types import Trajectory


def version_staleness(oldest_version: int, version: int) -> int:
    """Versions between `version` and an oldest action token sampled by `oldest_version` (< 0: no action
    token, staleness 0)."""
    return version - oldest_version if oldest_version >= 0 else 0


def trajectory_staleness(traj: Trajectory, version: int) -> int:
    """Versions between `version` and the trajectory's oldest action token of the current pool (0 if none).

    Tokens of the lagging pool (cross-policy sampling) are old on purpose and bounded apart, by
    `lagging_staleness`: counting them here would drop every trajectory that used the lagging pool."""
    return version_staleness(traj.oldest_version(lagging=False), version)


def lagging_staleness(traj: Trajectory, version: int) -> int:
    """Versions between `version` and the trajectory's oldest action token of the lagging pool (0 if none)."""
    return version_staleness(traj.oldest_version(lagging=True), version)


def is_stale(traj: Trajectory, version: int, max_staleness: int, lagging_max_staleness: int) -> bool:
    """Whether the trajectory is too old to train on at `version`: current-pool tokens more than
    `max_staleness` behind, or lagging-pool tokens more than `lagging_max_staleness` behind."""
    return (trajectory_staleness(traj, version) > max_staleness
            or lagging_staleness(traj, version) > lagging_max_staleness)


def admit_limit(max_staleness: int, engine_version: int, base_version: int, groups_per_step: int) -> int:
    """Groups a rollout rank may have started: AReaL's bound, counted from the version this life of the rank
    began on (`base_version`), with the engine's version (the one that samples them). A group started under it
    is at most `max_staleness` versions old when the trainer takes it."""
    return (max_staleness + engine_version - base_version + 1) * groups_per_step


def staleness(
    policy_version: Tensor,  # [B, T] int, version that sampled each token (-1 where mask 0)
    mask: Tensor,  # [B, T] loss mask
    current_version: int,
) -> Tensor:  # [B] long
    """Versions between the trainer and each sequence's oldest action token.

    Args:
        policy_version: [B, T] version per token; only action tokens are read.
        mask: [B, T] loss mask, nonzero on action tokens.
        current_version: the trainer's policy version now.

    Returns:
        [B] long: current_version − min over action tokens of policy_version; 0 for a sequence with no
        action token. Negative values (a token from a version the trainer has not reached) are returned
        as they are, not hidden: they point at a bookkeeping bug upstream.
    """
    m = mask.bool()
    if m.shape[1] == 0:
        return torch.zeros(m.shape[0], dtype=torch.long, device=m.device)
    v = policy_version.long()
    big = torch.iinfo(torch.long).max
    oldest = torch.where(m, v, torch.full_like(v, big)).amin(dim=1)  # [B]
    return torch.where(m.any(dim=1), current_version - oldest, torch.zeros_like(oldest))


def fresh_mask(
    staleness: Tensor,  # [B] long
    max_staleness: int,
) -> Tensor:  # [B] bool
    """True for sequences at most `max_staleness` versions old (to train on); the caller counts the rest.

    Args:
        staleness: [B] from `staleness`.
        max_staleness: ≥ 0; 0 keeps only sequences sampled entirely by the current version.

    Returns:
        [B] bool keep-mask.
    """
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    return staleness <= max_staleness


def truncated_is_weights(
    logp_prox: Tensor,  # [B, T] log-probs under the proximal (trainer-recomputed) policy
    behaviour_logp: Tensor,  # [B, T] log-probs of the engine that sampled the tokens
    mask: Tensor,  # [B, T] loss mask
    bound: float,
) -> Tensor:  # [B, T]
    """Importance weights min(π_prox / π_behaviour, bound) per action token, as constants.

    Args:
        logp_prox: [B, T] proximal log-probs.
        behaviour_logp: [B, T] behaviour log-probs.
        mask: [B, T] loss mask.
        bound: truncation (> 0), e.g. 2.0.

    Returns:
        [B, T] detached weights in (0, bound]; exactly 0 where mask is 0.
    """
    if bound <= 0:
        raise ValueError(f"bound must be > 0, got {bound}")
    m = mask.bool()
    zero = torch.zeros_like(logp_prox)
    log_w = torch.where(m, logp_prox.detach(), zero) - torch.where(m, behaviour_logp.detach().to(zero.dtype), zero)
    w = torch.exp(log_w).clamp(max=bound)
    return torch.where(m, w, zero)
