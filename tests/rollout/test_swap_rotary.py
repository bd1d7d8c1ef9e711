"""A weight swap into vLLM loads every weight and no longer warns about the rotary caches: after the swap, the
engine's log-probs of what it sampled equal the new weights' under transformers (a Llama-architecture stand-in, as
SmolLM2 is), and vLLM did not log `RotaryEmbedding: Failed to load weights` (it did at every swap: its layerwise
reload counted the cos/sin cache, which no checkpoint holds, as a weight; `engine._rotary_caches_are_not_weights`)."""
from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from agentrl.models import standins
from agentrl.rollout.engine import SamplingConfig, VLLMEngine
from agentrl.trainer.logprobs import token_logprobs

pytest.importorskip("vllm")
PROMPT = [5, 17, 42, 99, 7, 64, 33, 8]


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def own_environ() -> Iterator[None]:
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_after_a_swap_vllm_gives_the_new_weights_logprobs_without_the_rotary_warning(tmp_path: Path,
                                                                                        own_environ: None) -> None:
    from transformers import AutoModelForCausalLM
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    model_dir = standins.build("plain-base", tmp_path / "model", num_layers=2, dtype="float32")
    new = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    records = _Records()
    reload_log = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    engine = VLLMEngine(str(model_dir), max_model_len=128, max_num_seqs=4, kv_cache_gib=1, seed=0)
    reload_log.addHandler(records)  # after the engine's start: vLLM's logging config clears its loggers' handlers
    try:
        asyncio.run(engine.load_weights(lambda: iter(list(new.state_dict().items())), 1))
        gen = asyncio.run(engine.generate(PROMPT, SamplingConfig(max_new_tokens=12, temperature=1.0, seed=0)))
    finally:
        reload_log.removeHandler(records)
        engine.close()
        destroy_model_parallel()
        destroy_distributed_environment()
    with torch.no_grad():
        logp, _ = token_logprobs(new, torch.tensor([PROMPT + gen.token_ids]), None)
    hf = logp[0, len(PROMPT) - 1:]  # [len(generated)]
    assert gen.version == 1 and len(gen.token_ids) > 0
    assert (hf - torch.tensor(gen.logprobs)).abs().max() < 1e-3
    assert not [m for m in records.messages if "Failed to load weights" in m], records.messages
