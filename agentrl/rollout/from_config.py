"""The rollout's model-facing slices of the run config: the model's conversation format and the engines a rank
builds (what it plays is `rollout.spec.RolloutSpec.from_config`)."""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agentrl.config import RunConfig
from agentrl.rollout.chat import ChatFormat
from agentrl.rollout.engine import ExpertEngine
from agentrl.rollout.engine_pool import EnginePool
from agentrl.rollout.placement import rank_slices, visible_gpus
from agentrl.types import current_engine_id, lagging_engine_id


def chat_format(cfg: RunConfig, model_dir: Path) -> ChatFormat:
    """The model's conversation format: its chat template (`model.chat_template` over the directory's own), tool
    parser (`model.tool_parser`), stop tokens (tokenizer, generation_config.json, `model.stop_tokens`) and the
    template check (`rollout.template_check`)."""
    m = cfg.model
    return ChatFormat.load(model_dir, m.tool_parser, m.stop_tokens, cfg.rollout.template_check, m.template_kwargs,
                           m.chat_template)


def engine_factory(cfg: RunConfig, model_dir: Path, client: Any, fmt: ChatFormat, rank: int = 0) -> Callable[[], Any]:
    """Builds this rank's engines: an `EnginePool` of `cluster.rollout.engines_per_rank` current vLLM engines
    and `lagging_engines_per_rank` lagging ones (ids from `agentrl.types`), or the scripted expert alone
    (`rollout.engine: expert`, which has no weights to lag). On GPU nodes (`gpus_per_node` > 0) each engine
    runs in its own process on its own slice of the GPUs this rank sees (`rank_devices`); a rank that sees the
    wrong number of GPUs fails here, at its start, not once the trainer's first weights have come."""
    r, pool = cfg.rollout, cfg.cluster.rollout
    devices = rank_devices(cfg) if r.engine != "expert" else []

    def make_engine():
        if r.engine == "expert":  # the task's scripted expert plays every episode (pipeline checks)
            return ExpertEngine(client)
        from agentrl.rollout.engine import VLLMEngine

        # dtype, TP, eager/CUDA graphs, memory share, max sequences, KV cache: cluster.rollout's
        # (RolloutTopology.engine_settings; on CPU float32 and eager, in this process, lingering rollout.linger_ms)
        settings = pool.engine_settings(r.concurrency, r.linger_ms)
        e, n = pool.engines_per_rank, pool.lagging_engines_per_rank
        ids = [current_engine_id(rank, j, e) for j in range(e)] + [lagging_engine_id(rank, k, n) for k in range(n)]
        built: list[VLLMEngine] = []
        try:
            for i, engine_id in enumerate(ids):  # one after the other (each start-up holds a lock)
                built.append(VLLMEngine(str(model_dir), r.max_model_len, seed=cfg.seed,
                                        engine_id=engine_id, devices=devices[i], **settings))
        except BaseException:
            for engine in built:
                engine.close()
            raise
        return EnginePool(built[:e], built[e:], r.lagging_prob, pool.lagging_refresh_steps,
                          seed=f"lagging/{cfg.seed}/{rank}")
    return make_engine


def rank_devices(cfg: RunConfig, environ: Mapping[str, str] = os.environ,
                 device_count: Callable[[], int] | None = None) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES for each engine of a rank (current ones first, then lagging: `placement`), from the
    GPUs the rank's process sees; all None on CPU (`gpus_per_node` 0: the engines run in this process).

    A rank that does not see exactly (engines_per_rank + lagging_engines_per_rank) x tensor_parallel_size
    GPUs fails here, before any engine starts, with the fields named."""
    pool = cfg.cluster.rollout
    if not pool.gpus_per_node:
        return [None] * (pool.engines_per_rank + pool.lagging_engines_per_rank)
    if device_count is None:
        def device_count() -> int:  # NVML's count: CUDA stays uninitialised in this process
            import torch

            return torch.cuda.device_count()
    visible = visible_gpus(environ.get("CUDA_VISIBLE_DEVICES"), device_count)
    return list(rank_slices(visible, pool.engines_per_rank, pool.lagging_engines_per_rank,
                            pool.tensor_parallel_size))
