"""Outcome advantages from grouped rewards (docs/architecture.md §5 steps 1–2), as vectorized tensor functions.

A batch holds B trajectories; trajectory j belongs to group `group_index[j]` in 0..G-1 (a group is
the n samples of one prompt). Each estimator maps rewards [B] to one advantage per trajectory [B];
`token_advantages` then spreads it over that trajectory's action tokens.

Standard deviations here are *population* std (divide by n, not n-1). The public GRPO code of verl
uses the sample std; the two differ by the factor sqrt((n-1)/n) per group, which only matters when
group sizes differ within a batch, and task normalization (`task_norm.py`) rescales afterwards anyway.
We pick population std so that the same convention holds here and in task normalization, and so that
the rewards [1, 0, 0, 1] give advantages of exactly ±1.

This module is pure math: no torch.distributed, no config. It does not know about tasks (see
`task_norm.py`) nor about infrastructure failures (callers drop `env_error`/`cancelled` before).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def _group_stats(rewards: Tensor, group_index: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-group count, mean, population std and a "constant group" flag, gathered back to [B].

    Returns:
        count [B] (float), mean [B], std [B], constant [B] (bool: every reward of the group is equal,
        which includes groups of one; detected exactly with max == min, not with std < tol).
    """
    num_groups = int(group_index.max()) + 1
    zeros = rewards.new_zeros(num_groups)
    count = zeros.index_add(0, group_index, torch.ones_like(rewards))  # [G]
    mean = zeros.index_add(0, group_index, rewards) / count.clamp(min=1)  # [G]
    centred = rewards - mean[group_index]  # [B]
    var = zeros.index_add(0, group_index, centred * centred) / count.clamp(min=1)  # [G]
    gmax = zeros.scatter_reduce(0, group_index, rewards, reduce="amax", include_self=False)  # [G]
    gmin = zeros.scatter_reduce(0, group_index, rewards, reduce="amin", include_self=False)  # [G]
    constant = (gmax == gmin)[group_index]  # [B]
    return count[group_index], mean[group_index], var.sqrt()[group_index], constant


def informative_groups(
    rewards: Tensor,  # [B] float
    group_index: Tensor,  # [B] long, group ids 0..G-1
) -> Tensor:  # [B] bool
    """True for trajectories whose group's rewards are not all equal (groups of one are uninformative).

    A group with one reward has no GRPO signal, and keeping its zero advantages in the batch is not
    harmless once task normalization re-centres: its tokens take the value −μ_task/σ_task, a push in
    whatever direction the other groups' token mean points (with long failed episodes, towards failing).
    Dropping such groups before normalization (as DAPO's dynamic sampling does) avoids that.
    """
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=torch.bool)
    return ~_group_stats(rewards, group_index)[3]


def grpo_advantages(
    rewards: Tensor,  # [B] float
    group_index: Tensor,  # [B] long, group ids 0..G-1
    eps: float = 1e-6,
) -> Tensor:  # [B]
    """GRPO: A_j = (R_j − mean_g R) / (std_g R + eps), std the population std of the group.

    A group of one, or one whose rewards are all equal, gives exactly 0 (not a rounding residue).

    Args:
        rewards: [B] final rewards.
        group_index: [B] long group id of each trajectory, 0..G-1 (ids may be unused).
        eps: added to the std.

    Returns:
        [B] advantages, same dtype as `rewards`.
    """
    if rewards.numel() == 0:
        return rewards.clone()
    _, mean, std, constant = _group_stats(rewards, group_index)
    adv = (rewards - mean) / (std + eps)
    return torch.where(constant, torch.zeros_like(adv), adv)


def rloo_advantages(
    rewards: Tensor,  # [B] float
    group_index: Tensor,  # [B] long, group ids 0..G-1
    eps: float = 1e-6,
) -> Tensor:  # [B]
    """RLOO: A_j = R_j − mean of the *other* rewards of the group (leave-one-out baseline).

    Not divided by a std. A group of one, or with all rewards equal, gives exactly 0.

    Args:
        rewards: [B] final rewards.
        group_index: [B] long group id of each trajectory, 0..G-1.
        eps: unused; kept so every estimator has the same signature.

    Returns:
        [B] advantages.
    """
    del eps
    if rewards.numel() == 0:
        return rewards.clone()
    count, mean, _, constant = _group_stats(rewards, group_index)
    # mean of the others = (n·mean − R_j)/(n − 1), so A_j = n/(n − 1) · (R_j − mean).
    adv = (rewards - mean) * count / (count - 1).clamp(min=1)
    return torch.where(constant, torch.zeros_like(adv), adv)


def reinforce_pp_advantages(
    rewards: Tensor,  # [B] float
    group_index: Tensor,  # [B] long, group ids 0..G-1
    eps: float = 1e-6,
) -> Tensor:  # [B]
    """REINFORCE++ with a group-mean baseline: subtract the group mean, then divide by the batch std.

    A_j = (R_j − mean_g R) / (std_batch(R − mean_g R) + eps), with the population std taken over all B
    trajectories (groups of one included, as zeros). After the group-mean subtraction the batch mean is
    already zero, so only the scale is normalized. OpenRLHF whitens over tokens instead of sequences;
    task normalization does the token-level whitening here. Constant groups give exactly 0.

    Args:
        rewards: [B] final rewards.
        group_index: [B] long group id of each trajectory, 0..G-1.
        eps: added to the batch std.

    Returns:
        [B] advantages.
    """
    if rewards.numel() == 0:
        return rewards.clone()
    _, mean, _, constant = _group_stats(rewards, group_index)
    centred = torch.where(constant, torch.zeros_like(rewards), rewards - mean)  # [B]
    batch_std = centred.pow(2).mean().sqrt()
    return centred / (batch_std + eps)


AdvantageEstimator = Callable[[Tensor, Tensor, float], Tensor]

ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {
    "grpo": grpo_advantages,
    "rloo": rloo_advantages,
    "reinforce_pp": reinforce_pp_advantages,
}


def token_advantages(
    seq_adv: Tensor,  # [B]
    mask: Tensor,  # [B, T] loss mask (bool or 0/1)
) -> Tensor:  # [B, T]
    """Broadcast one advantage per sequence to its action tokens (docs/architecture.md §5 step 2).

    Args:
        seq_adv: [B] sequence advantages.
        mask: [B, T] loss mask, nonzero on action tokens.

    Returns:
        [B, T] with seq_adv[b] where mask is set, exactly 0 elsewhere.
    """
    expanded = seq_adv[:, None].expand(mask.shape)
    return torch.where(mask.bool(), expanded, torch.zeros_like(expanded))
