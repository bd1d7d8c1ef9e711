"""Engines in their own EngineCore processes, as on GPU nodes, run here on CPU (slow: about 100 s on the shared
machine, so left out of the default run; `-m slow`).

Two real vLLM engines built with `devices` (an empty CUDA_VISIBLE_DEVICES: this machine has no GPU) behind one
pool: the parent's environment is restored, the episodes alternate between them, and a swap through the
weights directory's loader (pickled to each engine's worker, which reads the files) makes both sample with the
new weights: their behaviour log-probs equal the trainer's under those weights.
"""
from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from agentrl.models import tiny
from agentrl.rollout.engine import SamplingConfig, VLLMEngine
from agentrl.rollout.engine_pool import EnginePool
from agentrl.rollout.weight_sources import DirWeights
from agentrl.trainer.logprobs import token_logprobs
from agentrl.transport import weights

pytest.importorskip("vllm")
pytestmark = pytest.mark.slow
PROMPT = [5, 17, 42, 99, 7]


@pytest.fixture
def own_environ() -> Iterator[None]:
    from vllm import envs

    envs.disable_envs_cache()  # an in-process engine of an earlier test froze VLLM_ENABLE_V1_MULTIPROCESSING
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_two_own_process_engines_share_episodes_and_swap_from_the_weights_dir(tmp_path: Path,
                                                                              own_environ: None) -> None:
    corpus = [f"look up {i} and answer {i * 3}" for i in range(60)]
    tok = tiny.train_tokenizer(corpus, 300, ["<|end|>", "<|pad|>"], "{{ messages }}", "<|end|>", "<|pad|>")
    model_dir = tiny.save(tiny.build_model(tok, 128, 1, 2, 256, 128, seed=0), tok, tmp_path / "model")
    v1 = tiny.build_model(tok, 128, 1, 2, 256, 128, seed=1)
    weights.publish(tmp_path / "run", 1, {k: v.detach().clone() for k, v in v1.state_dict().items()})
    os.environ["CUDA_VISIBLE_DEVICES"] = "rank-gpus"
    engines = [VLLMEngine(str(model_dir), max_model_len=128, max_num_seqs=4, kv_cache_gib=1, seed=0, engine_id=i,
                          devices="") for i in range(2)]
    pool = EnginePool(engines)
    try:
        assert [type(e._engine.engine_core).__name__ for e in engines] == ["SyncMPClient"] * 2
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "rank-gpus" and "VLLM_WORKER_MULTIPROC_METHOD" not in os.environ
        s = SamplingConfig(8, 1.0, seed=0)

        async def run() -> list:
            first = await asyncio.gather(*[pool.generate(PROMPT, s, session_id=f"e{i}") for i in range(4)])
            version, load = DirWeights(tmp_path / "run").newest(1)
            await pool.load_weights(load, version)
            return list(first) + await asyncio.gather(*[pool.generate(PROMPT, s, session_id=f"e{i}")
                                                        for i in range(4)])
        gens = asyncio.run(run())
    finally:
        pool.close()
    assert [(g.engine_id, g.version) for g in gens] == [(0, 0), (1, 0)] * 2 + [(0, 1), (1, 1)] * 2
    v1.eval()
    for g in gens[4:]:
        with torch.no_grad():
            logp, _ = token_logprobs(v1, torch.tensor([PROMPT + g.token_ids]), None)
        assert torch.allclose(logp[0, len(PROMPT) - 1:], torch.tensor(g.logprobs), atol=2e-3)
