"""The rollout's slices of the run config, shared by both schedules' entry points (`jobs.rollout`,
`jobs.rollout_async`): the plan of the role and the engines it builds."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.config import RunConfig
from agentrl.envs.tasks import task_name
from agentrl.rollout import role
from agentrl.rollout.agent_loop import EpisodeLimits
from agentrl.rollout.chat import ChatFormat
from agentrl.rollout.engine import ExpertEngine
from agentrl.rollout.engine_pool import EnginePool
from agentrl.types import lagging_engine_id


def make_plan(cfg: RunConfig) -> role.Plan:
    """The rollout's slice of the run config (both schedules)."""
    r = cfg.rollout
    return role.Plan(
        tasks=tuple(task_name(t) for t in cfg.envs.tasks), steps=cfg.trainer.steps, prompts_per_step=r.prompts_per_step,
        samples_per_prompt=r.samples_per_prompt, expert_samples=r.expert_samples if cfg.trainer.sft_steps else 0,
        eval_split=r.eval_split, eval_samples=r.eval_samples, eval_sampled=r.eval_sampled, concurrency=r.concurrency,
        temperature=r.temperature, top_p=r.top_p,
        limits=EpisodeLimits(r.max_turns, r.max_model_len, r.max_new_tokens),
        retry=role.Retry(max_retries=r.env_retries, capacity_wait_s=r.env_wait_s),
        wait_timeout_s=cfg.cluster.role_timeout_s, seed=cfg.seed, poll_s=cfg.transport.poll_s,
    )


def chat_format(cfg: RunConfig, model_dir: Path) -> ChatFormat:
    """The model's conversation format: its chat template, tool parser (`model.tool_parser`), stop tokens
    (tokenizer, generation_config.json, `model.stop_tokens`) and the template check (`rollout.template_check`)."""
    m = cfg.model
    return ChatFormat.load(model_dir, m.tool_parser, m.stop_tokens, cfg.rollout.template_check, m.template_kwargs)


def engine_factory(cfg: RunConfig, model_dir: Path, client: Any, fmt: ChatFormat, rank: int = 0) -> Callable[[], Any]:
    """Builds this rank's engines: an `EnginePool` of the current vLLM engine (id `rank`) and
    `cluster.rollout.lagging_engines_per_rank` lagging ones (ids from `agentrl.types.lagging_engine_id`), or
    the scripted expert alone (`rollout.engine: expert`, which has no weights to lag)."""
    r, pool = cfg.rollout, cfg.cluster.rollout

    def make_engine():
        if r.engine == "expert":  # the task's scripted expert plays every episode (pipeline checks)
            return ExpertEngine(client)
        from agentrl.rollout.engine import VLLMEngine

        def vllm(engine_id: int) -> VLLMEngine:
            # dtype, TP, eager/CUDA graphs, memory share, max sequences, KV cache: cluster.rollout's
            # (RolloutTopology.engine_settings; on CPU float32 and eager, as before)
            return VLLMEngine(str(model_dir), r.max_model_len, kv_cache_gib=r.kv_cache_gib, seed=cfg.seed,
                              engine_id=engine_id, **pool.engine_settings(r.concurrency))
        n = pool.lagging_engines_per_rank
        current = vllm(rank)
        lagging = []
        try:
            lagging = [vllm(lagging_engine_id(rank, k, n)) for k in range(n)]
        except BaseException:
            for e in [current, *lagging]:
                e.close()
            raise
        return EnginePool(current, lagging, pool.lagging_prob if n else 0.0, pool.lagging_refresh_steps,
                          seed=f"lagging/{cfg.seed}/{rank}")
    return make_engine
