"""Cross-policy sampling with real vLLM engines (CPU build) and the real agent loop against a live env.

1. Two engines with different weights (v1 current, v0 lagging), turns routed with p = 0.5: every action
   token's recorded behaviour log-prob equals the log-prob that the trainer's model computes for it with the
   weights of the version the token recorded, and not with the other version's weights.
2. A pool with a lagging engine and p = 0 gives token-identical trajectories to a rank without one.
"""
from __future__ import annotations

import asyncio
import copy
import gc
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.config import RunConfig, load_config
from agentrl.models import tiny
from agentrl.rollout.agent_loop import EpisodeLimits
from agentrl.rollout.collect import collect
from agentrl.rollout.engine import SamplingConfig
from agentrl.rollout.engine_pool import EnginePool
from agentrl.rollout.from_config import engine_factory
from agentrl.serving.client import EnvClient
from agentrl.serving.controller.server import start_controller
from agentrl.serving.worker import start_worker
from agentrl.trainer.logprobs import token_logprobs
from agentrl.trainer.model_load import load_model
from agentrl.types import Trajectory, is_lagging_engine, lagging_engine_id

pytest.importorskip("vllm")
MAX_LEN, NEW_TOKENS = 384, 16


def release_vllm() -> None:
    """Drop the process group vLLM made (world size 1) once its engines are gone: a closed engine that is
    garbage-collected later would tear down the groups of the engines started after it."""
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    gc.collect()
    destroy_model_parallel()
    destroy_distributed_environment()


@pytest.fixture(autouse=True)
def own_environ() -> Iterator[None]:
    """vLLM writes to os.environ, which later child processes would inherit: undo it (and its process group)."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
    release_vllm()


@pytest.fixture(scope="module")
def model_dir(lookup_tokenizer, tmp_path_factory) -> Path:
    model = tiny.build_model(lookup_tokenizer, 128, 1, 2, 256, 512, seed=0)
    return tiny.save(model, lookup_tokenizer, tmp_path_factory.mktemp("xpol") / "model")


def perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """A copy whose every weight moved by half its own spread: a clearly different policy (v1)."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.5 * p.std())
    return out


def loader(model: torch.nn.Module) -> Callable[[], Any]:
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return lambda: iter(state.items())


async def with_env(fn: Callable[[Any], Any]) -> Any:
    cfg = RunConfig()
    controller = await start_controller(cfg.controller)
    worker = await start_worker(cfg.envs, cfg.controller, controller.url, "worker-xpol", expert_route=False)
    client = EnvClient(controller.url)
    try:
        for _ in range(200):
            if (await client.status())["workers"]:
                break
            await asyncio.sleep(0.02)
        return await fn(client)
    finally:
        await client.close()
        await worker.stop()
        await controller.stop()


def episodes(engine: Any, fmt: Any, n: int, concurrency: int) -> list[Trajectory]:
    sampling = SamplingConfig(NEW_TOKENS, 1.0, 1.0, fmt.stop_ids)

    async def go(client: Any) -> list[Trajectory]:
        idx = (await client.indices("lookup", "test"))[:n]
        reqs = [("lookup", i, f"g-{i}") for i in idx]
        trajs, _ = await collect(client, engine, fmt, reqs, sampling, EpisodeLimits(4, MAX_LEN, NEW_TOKENS),
                                 concurrency, 0)
        return trajs
    return asyncio.run(with_env(go))


def hf_logprobs(model: torch.nn.Module, t: Trajectory) -> torch.Tensor:
    """[T]: log-prob of each token given the ones before it (0 at position 0, which nothing predicts)."""
    with torch.no_grad():
        logp, _ = token_logprobs(model, torch.tensor(t.tokens[None].astype("int64")), None)
    return torch.cat([torch.zeros(1), logp[0]])


def test_lagging_tokens_carry_the_log_probs_of_the_version_that_sampled_them(lookup_format, model_dir) -> None:
    from agentrl.rollout.engine import VLLMEngine

    tok = lookup_format
    v0 = load_model(model_dir, torch.get_num_threads())
    v1 = perturbed(v0, seed=1)
    lag_id = lagging_engine_id(0, 0, 1)
    current = VLLMEngine(str(model_dir), MAX_LEN, max_num_seqs=8, kv_cache_gib=1, seed=0, engine_id=0)
    lagging = VLLMEngine(str(model_dir), MAX_LEN, max_num_seqs=8, kv_cache_gib=1, seed=0, engine_id=lag_id)
    pool = EnginePool(current, [lagging], lagging_prob=0.5, refresh_steps=5, seed=0)
    try:
        asyncio.run(pool.load_weights(loader(v0), 0))
        asyncio.run(pool.load_weights(loader(v1), 1))  # 1 < K = 5: the lagging engine keeps v0
        assert (current.version, lagging.version) == (1, 0)
        trajs = episodes(pool, tok, 6, concurrency=6)
    finally:
        pool.close()

    models = {0: v0, 1: v1}
    producers, checked = set(), 0
    for t in trajs:
        assert t.num_turns >= 2, t.status  # several turns: an episode can mix the pools
        lp = {v: hf_logprobs(m, t) for v, m in models.items()}
        act = torch.from_numpy(t.loss_mask.astype(bool))
        recorded = torch.from_numpy(t.logprobs)
        versions, engines = torch.from_numpy(t.policy_version), torch.from_numpy(t.engine.astype("int64"))
        for e, v in ((0, 1), (lag_id, 0)):  # each engine held one version throughout
            sel = act & (engines == e)
            if not sel.any():
                continue
            producers.add(e)
            assert (versions[sel] == v).all()
            own = (lp[v][sel] - recorded[sel]).abs().max().item()
            other = (lp[1 - v][sel] - recorded[sel]).abs().max().item()
            assert own < 2e-3, (e, v, own)  # the behaviour log-prob is the recorded version's
            assert other > 0.05, (e, v, other)  # and not the other version's
            checked += int(sel.sum())
        assert not (act & (engines != 0) & (engines != lag_id)).any()
    assert producers == {0, lag_id} and checked > 50
    mixed = [t for t in trajs if len(set(t.engine[t.loss_mask == 1].tolist())) == 2]
    assert mixed, "no episode mixed turns of both pools"
    assert all(is_lagging_engine(e) for t in mixed for e in t.engine[t.loss_mask == 1] if e != 0)


def test_prob_zero_with_a_lagging_engine_is_the_plain_rank(lookup_format, model_dir) -> None:
    """Same seed, same requests in the same order (one episode at a time: batching depends on timing)."""
    tok = lookup_format
    v0 = load_model(model_dir, torch.get_num_threads())
    def run(overrides: list[str]) -> list[Trajectory]:
        cfg = load_config("smoke", [f"rollout.max_model_len={MAX_LEN}", "rollout.concurrency=4", *overrides])
        engine = engine_factory(cfg, model_dir, None, tok, rank=0)()
        try:
            assert len(engine.lagging) == len(overrides) // 2
            asyncio.run(engine.load_weights(loader(v0), 0))
            return episodes(engine, tok, 4, concurrency=1)
        finally:
            engine.close()

    plain = run([])
    release_vllm()
    pooled = run(["cluster.rollout.lagging_engines_per_rank=1", "rollout.lagging_prob=0"])
    assert [t.index for t in plain] == [t.index for t in pooled]
    assert sum(t.num_action_tokens for t in plain) > 20
    for a, b in zip(plain, pooled):
        assert a.tokens.tolist() == b.tokens.tolist()
        assert a.logprobs.tolist() == pytest.approx(b.logprobs.tolist(), abs=1e-5)
        assert a.engine.tolist() == b.engine.tolist() and set(b.engine[b.loss_mask == 1].tolist()) == {0}


def test_two_current_engines_share_a_ranks_episodes(lookup_format, model_dir) -> None:
    """engines_per_rank 2 on rank 1 of 2: two real CPU engines (ids 2 and 3), both given every version; the
    episodes, one at a time, alternate between them and each keeps its engine for all of its turns."""
    tok = lookup_format
    cfg = load_config("smoke", [f"rollout.max_model_len={MAX_LEN}", "rollout.concurrency=4", "cluster.schedule=async",
                                "cluster.rollout.ranks=2", "cluster.rollout.engines_per_rank=2"])
    engine = engine_factory(cfg, model_dir, None, tok, rank=1)()
    try:
        assert [e.engine_id for e in engine.currents] == [2, 3] and not engine.lagging
        asyncio.run(engine.load_weights(loader(load_model(model_dir, torch.get_num_threads())), 4))
        assert [e.version for e in engine.currents] == [4, 4]
        trajs = episodes(engine, tok, 4, concurrency=1)
    finally:
        engine.close()
    producers = [set(t.engine[t.loss_mask == 1].tolist()) for t in trajs]
    assert producers == [{2}, {3}, {2}, {3}] and engine.episodes == [2, 2]
    assert all(set(t.policy_version[t.loss_mask == 1].tolist()) == {4} for t in trajs)
    assert sum(t.num_action_tokens for t in trajs) > 20
