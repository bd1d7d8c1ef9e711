"""What one step trains on, and why the rest is left out: pure functions over a step's trajectories."""
from __future__ import annotations

import torch

from agentrl.algorithms.advantages import informative_groups
from agentrl.algorithms.staleness import fresh_mask, staleness
from agentrl.types import Trajectory


def shaped_rewards(trajs: list[Trajectory], fail_penalty: float) -> list[float]:
    """The reward RL sees: the episode's, or `fail_penalty` for an agent failure (invalid action, limits)."""
    return [fail_penalty if t.status.is_agent_failure else float(t.reward) for t in trajs]


def staleness_of(oldest_version: torch.Tensor, current: int) -> torch.Tensor:
    """Staleness of trajectories given their oldest action-token version (one column per trajectory)."""
    mask = (oldest_version >= 0).long()[:, None]
    return staleness(oldest_version[:, None].clamp(min=0), mask, current)


def select_training_data(trajs: list[Trajectory], version: int, max_staleness: int, lagging_max_staleness: int,
                         fail_penalty: float, drop_uniform_groups: bool
                         ) -> tuple[list[Trajectory], list[float], dict[str, float]]:
    """What one step trains on, its shaped rewards, and why the rest was left out (every exclusion counted).

    Infrastructure outcomes are never trained on; trajectories more than `max_staleness` versions old
    (lagging-pool tokens: `lagging_max_staleness`) are dropped; groups whose (shaped) rewards are all equal
    carry no GRPO signal and are dropped before task normalization could turn their zero advantages into a
    bias (see `informative_groups`).
    """
    usable = [t for t in trajs if not t.status.is_infra]
    counts = {"dropped_infra": len(trajs) - len(usable), "dropped_stale": 0, "dropped_uniform": 0,
              "staleness_max": 0}
    if usable:
        # current-pool tokens against max_staleness; lagging-pool ones (old on purpose) against their own bound
        stale = staleness_of(torch.tensor([t.oldest_version(lagging=False) for t in usable]), version)
        lagging = staleness_of(torch.tensor([t.oldest_version(lagging=True) for t in usable]), version)
        keep = (fresh_mask(stale, max_staleness) & fresh_mask(lagging, lagging_max_staleness)).tolist()
        counts["dropped_stale"] = keep.count(False)
        counts["staleness_max"] = int(stale.max())
        usable = [t for t, k in zip(usable, keep) if k]
    rewards = shaped_rewards(usable, fail_penalty)
    if usable and drop_uniform_groups:
        ids = {g: i for i, g in enumerate(dict.fromkeys(t.group_id for t in usable))}
        keep = informative_groups(torch.tensor(rewards), torch.tensor([ids[t.group_id] for t in usable])).tolist()
        counts["dropped_uniform"] = keep.count(False)
        usable = [t for t, k in zip(usable, keep) if k]
        rewards = [r for r, k in zip(rewards, keep) if k]
    return usable, rewards, counts
