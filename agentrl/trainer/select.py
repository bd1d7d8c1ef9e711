"""What one step trains on, and why the rest is left out: pure functions over a step's trajectories."""
from __future__ import annotations

import torch

from agentrl.algorithms.advantages import informative_groups
from agentrl.algorithms.staleness import is_stale, trajectory_staleness
from agentrl.types import Trajectory


def shaped_rewards(trajs: list[Trajectory], fail_penalty: float) -> list[float]:
    """The reward RL sees: the episode's, or `fail_penalty` for an agent failure (invalid action, limits)."""
    return [fail_penalty if t.status.is_agent_failure else float(t.reward) for t in trajs]


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
        # the queue's rule (`algorithms.staleness.is_stale`): it already left out what was stale on arrival or at
        # a new version, so nothing is dropped here unless a trajectory reaches the step by another route
        keep = [not is_stale(t, version, max_staleness, lagging_max_staleness) for t in usable]
        counts["dropped_stale"] = keep.count(False)
        counts["staleness_max"] = max(trajectory_staleness(t, version) for t in usable)
        usable = [t for t, k in zip(usable, keep) if k]
    rewards = shaped_rewards(usable, fail_penalty)
    if usable and drop_uniform_groups:
        ids = {g: i for i, g in enumerate(dict.fromkeys(t.group_id for t in usable))}
        keep = informative_groups(torch.tensor(rewards), torch.tensor([ids[t.group_id] for t in usable])).tolist()
        counts["dropped_uniform"] = keep.count(False)
        usable = [t for t, k in zip(usable, keep) if k]
        rewards = [r for r, k in zip(rewards, keep) if k]
    return usable, rewards, counts
