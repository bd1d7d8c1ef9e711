"""What a rollout rank plays, from the run config: its own section (`rollout`, read where it is used) and the few
values the rollout takes from other sections, worked out here once."""
from __future__ import annotations

from dataclasses import dataclass

from agentrl.config import RolloutConfig, RunConfig
from agentrl.config.task_options import task_names
from agentrl.rollout.agent_loop import EpisodeLimits
from agentrl.rollout.collect import Retry


@dataclass(frozen=True)
class RolloutSpec:
    """What every rollout rank plays (the rank's own share and bounds are its `RankPlace`). The rollout section is
    read as is (`spec.rollout.concurrency`); the other fields are derived, each from the config in `from_config`,
    whose defaults are the only ones."""

    rollout: RolloutConfig
    tasks: tuple[str, ...]
    """The names the workers serve `envs.tasks` under (learned from the config, never by importing the tasks)."""
    demonstrations: bool
    """Whether rank 0 first plays the scripted expert on `rollout.expert_samples` training samples of each task: only
    for a warm start (`trainer.warm_start_steps` > 0)."""
    train: bool
    """Whether the ranks play training episodes: not in a control run (`trainer.update=warm_start`), whose steps
    imitate the demonstrations; its ranks only evaluate (rank 0: before and after)."""
    limits: EpisodeLimits
    retry: Retry
    wait_timeout_s: float
    """How long a rank waits for the trainer (its first and final weights, the channel's close):
    `cluster.role_timeout_s`."""
    seed: int
    poll_s: float

    @classmethod
    def from_config(cls, cfg: RunConfig) -> RolloutSpec:
        """The rollout's slice of the run config."""
        r, t = cfg.rollout, cfg.trainer
        return cls(
            rollout=r, tasks=task_names(cfg.envs), demonstrations=t.warm_start_steps > 0 and r.expert_samples > 0,
            train=t.update == "rl", limits=EpisodeLimits(r.max_turns, r.max_model_len, r.max_new_tokens),
            retry=Retry(max_retries=r.env_retries, capacity_wait_s=r.env_wait_s),
            wait_timeout_s=cfg.cluster.role_timeout_s, seed=cfg.seed, poll_s=cfg.transport.poll_s)
