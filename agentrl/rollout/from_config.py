"""The rollout's model-facing slices of the run config: the model's conversation format and the engines a rank
builds (what it plays is `rollout.plan.RolloutPlan.from_config`)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.config import RunConfig
from agentrl.rollout.chat import ChatFormat
from agentrl.rollout.engine import ExpertEngine
from agentrl.rollout.engine_pool import EnginePool
from agentrl.types import lagging_engine_id


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
