"""The trainer's slices of the run config, shared by both schedules' entry points (`jobs.trainer`,
`jobs.trainer_async`): the schedule of the role and the update's hyper-parameters."""
from __future__ import annotations

from agentrl.config import RunConfig
from agentrl.trainer import role
from agentrl.trainer.step import RLHyper


def lagging_max_staleness(cfg: RunConfig) -> int:
    """How old a lagging-pool token may be when trained on. A lagging engine reloads once the current engine
    is K = lagging_refresh_steps versions ahead, so it samples at most K - 1 versions behind the current
    engine; the trainer may then be up to max_staleness versions further on (one version of slack)."""
    pool = cfg.cluster.rollout
    return cfg.algo.max_staleness + (pool.lagging_refresh_steps if pool.lagging_engines_per_rank else 0)


def plan(cfg: RunConfig) -> tuple[role.Schedule, RLHyper]:
    """The trainer's slices of the run config: its schedule and the update's hyper-parameters."""
    t, a = cfg.trainer, cfg.algo
    hyper = RLHyper.from_config(a, t, cfg.rollout.temperature)
    schedule = role.Schedule(
        steps=t.steps, sft_steps=t.sft_steps, sft_batch=t.sft_batch, sft_lr=t.sft_lr, sft_all_tokens=t.sft_all_tokens,
        lr=t.lr, weight_decay=t.weight_decay, max_staleness=a.max_staleness, drop_uniform_groups=a.drop_uniform_groups,
        fail_penalty=a.fail_penalty, wait_timeout_s=cfg.cluster.role_timeout_s, seed=cfg.seed + t.seed,
        poll_s=cfg.transport.poll_s, warmup_steps=t.warmup_steps, checkpoint_every=t.checkpoint_every,
        keep_checkpoints=t.keep_checkpoints, sft_successful_only=t.sft_successful_only, sft_target=t.sft_target,
        sft_min_token_prob=t.sft_min_token_prob, sft_check_every=t.sft_check_every, sft_holdout=t.sft_holdout,
        update=t.update, lagging_max_staleness=lagging_max_staleness(cfg))
    return schedule, hyper
