"""What a rollout rank plays, from the run config: tasks, group shape, sampling, limits, evaluation, retries."""
from __future__ import annotations

from dataclasses import dataclass

from agentrl.config import RunConfig
from agentrl.config.task_options import task_names
from agentrl.rollout.agent_loop import EpisodeLimits
from agentrl.rollout.collect import Retry


@dataclass(frozen=True)
class RolloutSpec:
    """What every rollout rank plays (the rank's own share and bounds are its `RankPlace`). No field has a default
    of its own: each comes from the config (`from_config`), whose defaults are the only ones."""

    tasks: tuple[str, ...]
    steps: int
    prompts_per_step: int
    samples_per_prompt: int
    expert_samples: int
    eval_split: str
    eval_samples: int
    concurrency: int
    temperature: float
    top_p: float
    limits: EpisodeLimits
    retry: Retry
    wait_timeout_s: float
    seed: int
    poll_s: float
    eval_sampled: int
    train: bool
    """Whether the ranks play training episodes: not in a control run (`trainer.update=sft`), whose steps imitate the
    demonstrations; its ranks only evaluate (rank 0: before and after)."""

    @classmethod
    def from_config(cls, cfg: RunConfig) -> RolloutSpec:
        """The rollout's slice of the run config."""
        r = cfg.rollout
        return cls(
            tasks=task_names(cfg.envs), steps=cfg.trainer.steps,
            prompts_per_step=r.prompts_per_step, samples_per_prompt=r.samples_per_prompt,
            expert_samples=r.expert_samples if cfg.trainer.sft_steps else 0, eval_split=r.eval_split,
            eval_samples=r.eval_samples, eval_sampled=r.eval_sampled, concurrency=r.concurrency,
            temperature=r.temperature, top_p=r.top_p,
            limits=EpisodeLimits(r.max_turns, r.max_model_len, r.max_new_tokens),
            retry=Retry(max_retries=r.env_retries, capacity_wait_s=r.env_wait_s),
            wait_timeout_s=cfg.cluster.role_timeout_s, seed=cfg.seed, poll_s=cfg.transport.poll_s,
            train=cfg.trainer.update == "rl")
