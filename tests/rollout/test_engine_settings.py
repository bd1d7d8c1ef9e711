"""The engine settings of the config reach vLLM: `engine_factory` → `VLLMEngine` → `vllm.LLM(...)`.

vLLM is replaced by a stand-in whose constructor raises with the arguments it got, so this runs in
milliseconds and checks the keyword arguments themselves (tests/rollout/test_engine_pool_vllm.py starts the
real CPU engine). On CPU the engines keep float32 and eager; on GPU nodes every setting is the config's, and
each engine takes the whole memory share of GPUs of its own (RolloutTopology.engine_settings; which GPUs:
tests/rollout/test_engine_placement.py).
"""
from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrl.config import load_config
from agentrl.rollout.from_config import engine_factory


class Built(Exception):
    def __init__(self, kwargs: dict[str, Any]) -> None:
        super().__init__("LLM built")
        self.kwargs = kwargs


def _llm(**kwargs: Any) -> None:
    raise Built(kwargs)


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    saved = dict(os.environ)
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=_llm))
    yield
    os.environ.clear()
    os.environ.update(saved)


def llm_kwargs(preset: str, overrides: list[str], gpus: int = 0) -> dict[str, Any]:
    """The first engine's `LLM(...)` arguments, in a rank that sees `gpus` GPUs (with gpus_per_node > 0)."""
    cfg = load_config(preset, overrides)
    if gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(gpus)))
    with pytest.raises(Built) as e:
        engine_factory(cfg, Path("/models/m"), None, None, rank=0)()
    return e.value.kwargs


def test_cpu_engines_keep_float32_and_eager(fake_vllm: None) -> None:
    kw = llm_kwargs("smoke", ["rollout.concurrency=12"])
    assert (kw["dtype"], kw["enforce_eager"], kw["tensor_parallel_size"], kw["max_num_seqs"]) == ("float32", True, 1, 12)
    assert "gpu_memory_utilization" not in kw and "kv_cache_memory_bytes" not in kw
    assert kw["model"] == "/models/m" and kw["logprobs_mode"] == "processed_logprobs"


def test_gpu_engines_take_every_setting_from_the_config(fake_vllm: None) -> None:
    kw = llm_kwargs("agentbench-qwen2.5-7b", [
        "cluster.rollout.engines_per_rank=1", "cluster.rollout.tensor_parallel_size=2",
        "cluster.rollout.gpu_memory_utilization=0.9", "cluster.rollout.max_num_seqs=96",
        "cluster.rollout.kv_cache_gib=8"], gpus=4)
    assert kw["dtype"] == "bfloat16" and kw["enforce_eager"] is False  # the preset: CUDA graphs
    assert kw["tensor_parallel_size"] == 2 and kw["max_num_seqs"] == 96
    assert kw["gpu_memory_utilization"] == pytest.approx(0.9)  # the current engine's GPUs are its own
    assert kw["kv_cache_memory_bytes"] == 8 << 30


def test_gpu_defaults_without_kv_size_or_lagging_pool(fake_vllm: None) -> None:
    kw = llm_kwargs("agentbench-qwen2.5-7b", ["cluster.rollout.lagging_engines_per_rank=0",
                                              "rollout.lagging_prob=0", "cluster.rollout.engines_per_rank=4",
                                              "cluster.rollout.enforce_eager=true"], gpus=4)
    assert kw["gpu_memory_utilization"] == pytest.approx(0.85) and "kv_cache_memory_bytes" not in kw
    assert kw["max_num_seqs"] == 256 and kw["enforce_eager"] is True  # rollout.concurrency of the preset
