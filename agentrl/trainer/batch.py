"""From trajectories to padded training tensors, and micro-batches by token budget.

Positions are aligned to *targets*: column t of every [B, T-1] tensor refers to predicting token t+1 from
tokens 0..t, so `mask[:, t]` is the loss mask of token t+1 and `behaviour_logp[:, t]` its sampled log-prob.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from agentrl.types import Trajectory


@dataclass
class TrainBatch:
    tokens: torch.Tensor  # [B, T] long, right-padded with pad_id
    attention: torch.Tensor  # [B, T] long, 1 on real tokens
    mask: torch.Tensor  # [B, T-1] float, 1 on action-token targets
    behaviour_logp: torch.Tensor  # [B, T-1]
    rewards: torch.Tensor  # [B]
    group_index: torch.Tensor  # [B] long, 0..G-1
    task_index: torch.Tensor  # [B] long, into task_names
    task_names: list[str]

    @property
    def num_action_tokens(self) -> int:
        return int(self.mask.sum().item())

    def select(self, rows: slice) -> TrainBatch:
        width = int(self.attention[rows].sum(1).max().item()) if self.attention[rows].numel() else 1
        return TrainBatch(self.tokens[rows, :width], self.attention[rows, :width], self.mask[rows, : width - 1],
                          self.behaviour_logp[rows, : width - 1], self.rewards[rows], self.group_index[rows],
                          self.task_index[rows], self.task_names)


def collate(trajs: list[Trajectory], rewards: list[float], pad_id: int) -> TrainBatch:
    """Pad trajectories (rows sorted by length, longest first, so micro-batches trim padding)."""
    order = sorted(range(len(trajs)), key=lambda i: -trajs[i].num_tokens)
    trajs = [trajs[i] for i in order]
    rewards = [rewards[i] for i in order]
    B, T = len(trajs), max(t.num_tokens for t in trajs)
    tokens = torch.full((B, T), pad_id, dtype=torch.long)
    attention = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T)
    blogp = torch.zeros(B, T)
    for i, t in enumerate(trajs):
        n = t.num_tokens
        tokens[i, :n] = torch.from_numpy(t.tokens.astype("int64"))
        attention[i, :n] = 1
        mask[i, :n] = torch.from_numpy(t.loss_mask.astype("float32"))
        blogp[i, :n] = torch.from_numpy(t.logprobs)
    groups = {g: k for k, g in enumerate(dict.fromkeys(t.group_id for t in trajs))}
    tasks = list(dict.fromkeys(t.task for t in trajs))
    return TrainBatch(
        tokens=tokens, attention=attention, mask=mask[:, 1:], behaviour_logp=blogp[:, 1:],
        rewards=torch.tensor(rewards, dtype=torch.float32),
        group_index=torch.tensor([groups[t.group_id] for t in trajs]),
        task_index=torch.tensor([tasks.index(t.task) for t in trajs]), task_names=tasks,
    )


def micro_batches(batch: TrainBatch, max_tokens: int) -> list[slice]:
    """Consecutive row ranges whose padded size (rows × longest row) stays within `max_tokens`."""
    lengths = batch.attention.sum(1).tolist()
    out, start = [], 0
    while start < len(lengths):
        end = start + 1
        while end < len(lengths) and (end + 1 - start) * lengths[start] <= max_tokens:
            end += 1
        out.append(slice(start, end))
        start = end
    return out
