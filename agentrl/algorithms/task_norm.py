"""Task advantage normalization (AgentRL paper eq. 1; docs/architecture.md §5 step 3).

For each task i, over all action tokens of task i in the batch: Ã = (Â − μ_i) / (σ_i + ε), with μ_i, σ_i
the mean and *population* std of those tokens' advantages. Tasks with long trajectories thus weigh no
more in the loss than tasks with short ones, and tasks with large reward scales no more than others.

It must run on the advantages *before* the loss is built: the public AgentRL code once applied it after
the optimizer step, where it changed nothing (tests/algorithms/test_task_norm.py checks the gradient).

Pure tensor math over the local batch. Under data parallelism the statistics are those of the rank's
batch; a trainer that wants global statistics reduces `task_stats` sums across ranks itself.
"""
from __future__ import annotations

import torch
from torch import Tensor


def task_stats(
    adv: Tensor,  # [B, T]
    mask: Tensor,  # [B, T] loss mask
    task_index: Tensor,  # [B] long, task ids 0..K-1
    num_tasks: int | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-task statistics of the advantages over action tokens.

    Args:
        adv: [B, T] token advantages.
        mask: [B, T] loss mask, nonzero on action tokens.
        task_index: [B] long task id of each sequence.
        num_tasks: K; defaults to max(task_index) + 1.

    Returns:
        count [K] (float, action tokens per task), mean [K], population std [K], and
        constant [K] (bool: every action-token advantage of the task is equal, checked exactly with
        max == min; also true for a task with no action tokens). Empty tasks have mean 0, std 0.
    """
    k = num_tasks if num_tasks is not None else (int(task_index.max()) + 1 if task_index.numel() else 0)
    m = mask.bool()
    x = torch.where(m, adv, torch.zeros_like(adv))  # [B, T]
    zeros = adv.new_zeros(k)
    count = zeros.index_add(0, task_index, m.sum(dim=1).to(adv.dtype))  # [K]
    mean = zeros.index_add(0, task_index, x.sum(dim=1)) / count.clamp(min=1)  # [K]
    centred = torch.where(m, adv - mean[task_index][:, None], torch.zeros_like(adv))  # [B, T]
    var = zeros.index_add(0, task_index, centred.pow(2).sum(dim=1)) / count.clamp(min=1)  # [K]
    # Exact constancy test (not std < tol): per-row masked max/min, then per task over rows with actions.
    if adv.shape[1] == 0:  # no tokens at all: every task is empty, hence constant
        return count, mean, var.sqrt(), torch.ones(k, dtype=torch.bool, device=adv.device)
    rows = m.any(dim=1)  # [B]
    row_max = torch.where(m, adv, torch.full_like(adv, -torch.inf)).amax(dim=1)[rows]  # [B']
    row_min = torch.where(m, adv, torch.full_like(adv, torch.inf)).amin(dim=1)[rows]  # [B']
    tmax = torch.full_like(zeros, -torch.inf).scatter_reduce(0, task_index[rows], row_max, "amax")  # [K]
    tmin = torch.full_like(zeros, torch.inf).scatter_reduce(0, task_index[rows], row_min, "amin")  # [K]
    constant = (tmax == tmin) | (count == 0)
    return count, mean, var.sqrt(), constant


def task_normalize(
    adv: Tensor,  # [B, T]
    mask: Tensor,  # [B, T] loss mask
    task_index: Tensor,  # [B] long, task ids 0..K-1
    eps: float = 1e-6,
) -> Tensor:  # [B, T]
    """Normalize advantages per task over its action tokens: zero mean, unit population std.

    Args:
        adv: [B, T] token advantages (e.g. from `token_advantages`).
        mask: [B, T] loss mask, nonzero on action tokens.
        task_index: [B] long task id of each sequence, 0..K-1 (ids may be unused).
        eps: added to each task's std.

    Returns:
        [B, T] normalized advantages; exactly 0 where mask is 0 and for every action token of a task
        whose action tokens all carry the same advantage (e.g. every group of the task solved).
    """
    if adv.numel() == 0:
        return adv.clone()
    _, mean, std, constant = task_stats(adv, mask, task_index)
    out = (adv - mean[task_index][:, None]) / (std[task_index][:, None] + eps)  # [B, T]
    keep = mask.bool() & ~constant[task_index][:, None]
    return torch.where(keep, out, torch.zeros_like(out))
