"""Each engine of a rollout rank on GPUs of its own: the slice arithmetic, the rank's start-up check, and what
`engine_factory` hands vLLM for each engine.

There is no GPU here, so vLLM's `LLM` is replaced by a stand-in that records, at the moment it is built, the
environment its EngineCore process would inherit (CUDA_VISIBLE_DEVICES, whether V1 multiprocessing is on,
spawn) and its keyword arguments. That the environment at construction is what the EngineCore process sees was
read from vLLM's source (docs/slurm.md, GPU placement); own-process engines themselves (spawned, stepped
through their client, swapped by a pickled loader) run on CPU in tests/rollout/test_engine_own_process.py
(slow).
"""
from __future__ import annotations

import os
import pickle
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agentrl.config import load_config
from agentrl.rollout.engine import _reload_in_worker
from agentrl.rollout.from_config import engine_factory, rank_devices
from agentrl.rollout.placement import engine_slice, rank_slices, visible_gpus

WATCHED = ("CUDA_VISIBLE_DEVICES", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_WORKER_MULTIPROC_METHOD",
           "VLLM_ALLOW_INSECURE_SERIALIZATION")


def test_engine_k_takes_gpus_k_tp_to_k_plus_one_tp_of_the_ranks() -> None:
    visible = visible_gpus("4,5,6,7,8,9", lambda: 99)
    assert visible == ["4", "5", "6", "7", "8", "9"]
    assert [engine_slice(visible, k, 2) for k in range(3)] == ["4,5", "6,7", "8,9"]
    assert [engine_slice(visible, k, 3) for k in range(2)] == ["4,5,6", "7,8,9"]
    assert rank_slices(visible, 2, 1, 2) == ["4,5", "6,7", "8,9"]
    assert visible_gpus(None, lambda: 3) == ["0", "1", "2"]  # unset: all of the node's
    assert visible_gpus("GPU-a1, GPU-b2", lambda: 0) == ["GPU-a1", "GPU-b2"] and visible_gpus("", lambda: 5) == []
    with pytest.raises(ValueError, match=r"GPUs \[6, 8\)"):
        engine_slice(visible, 3, 2)


@pytest.mark.parametrize("visible", [["0", "1", "2", "3"], [str(i) for i in range(8)]])
def test_a_rank_that_does_not_see_its_engines_gpus_fails_naming_the_fields(visible: list[str]) -> None:
    with pytest.raises(ValueError) as e:
        rank_slices(visible, 2, 1, 2)
    msg = str(e.value)
    assert f"sees {len(visible)} GPU(s)" in msg and "= 6" in msg
    for field in ("cluster.rollout.engines_per_rank 2", "cluster.rollout.lagging_engines_per_rank 1",
                  "cluster.rollout.tensor_parallel_size 2"):
        assert field in msg


class InprocClient:  # the class names VLLMEngine tells vLLM's two engine clients apart by
    pass


class SyncMPClient:
    def __init__(self) -> None:
        self.shut = False

    def shutdown(self) -> None:
        self.shut = True


class StandIn:
    """vLLM's `LLM` as far as `VLLMEngine` uses it before its first request."""

    built: list[dict[str, Any]] = []

    def __init__(self, **kwargs: Any) -> None:
        env = {k: os.environ.get(k) for k in WATCHED}
        StandIn.built.append({"env": env, **kwargs})
        core = SyncMPClient() if env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1" else InprocClient()
        self.llm_engine = SimpleNamespace(engine_core=core, has_unfinished_requests=lambda: False)


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    saved = dict(os.environ)
    for k in WATCHED:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=StandIn))
    StandIn.built = []
    yield StandIn.built
    os.environ.clear()
    os.environ.update(saved)


GPU_RANK = ["cluster.schedule=async", "cluster.rollout.nodes=2", "cluster.rollout.ranks=2", "cluster.rollout.gpus_per_node=6",
            "cluster.rollout.engines_per_rank=2", "cluster.rollout.lagging_engines_per_rank=1",
            "rollout.lagging_prob=0.25", "cluster.rollout.tensor_parallel_size=2",
            "cluster.rollout.gpu_memory_utilization=0.9", "cluster.rollout.enforce_eager=false"]


@pytest.mark.parametrize("visible", ["0,1,2,3,4,5", "4,5,6,7,8,9"])
def test_each_engine_starts_its_own_process_on_its_own_gpus(stand_in: list[dict[str, Any]], visible: str) -> None:
    """2 current + 1 lagging engines of TP 2 on rank 1 of a 6-GPU node, as Slurm binds it (or a whole node)."""
    os.environ["CUDA_VISIBLE_DEVICES"] = visible
    cfg = load_config("smoke", GPU_RANK)
    pool = engine_factory(cfg, Path("/models/m"), None, None, rank=1)()
    gpus = visible.split(",")
    assert [b["env"]["CUDA_VISIBLE_DEVICES"] for b in stand_in] == [",".join(gpus[i:i + 2]) for i in (0, 2, 4)]
    for b in stand_in:  # its own EngineCore process, spawned, able to take a pickled weight loader
        assert b["env"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1" and b["env"]["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
        assert b["env"]["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1"
        assert b["gpu_memory_utilization"] == 0.9  # the whole share: no other engine on these GPUs
        assert (b["tensor_parallel_size"], b["enforce_eager"]) == (2, False)
    # the parent's environment is as before (the launcher's binding), only the serialization switch stays
    assert os.environ["CUDA_VISIBLE_DEVICES"] == visible
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ and "VLLM_WORKER_MULTIPROC_METHOD" not in os.environ
    ids = [e.engine_id for e in pool.currents], [e.engine_id for e in pool.lagging]
    assert ids == ([2, 3], [1001])  # rank 1: current 1 * 2 + j, lagging 1000 + 1 * 1 + k
    assert [e.devices for e in (*pool.currents, *pool.lagging)] == [",".join(gpus[i:i + 2]) for i in (0, 2, 4)]
    assert all(e._lock is not pool.currents[0]._lock for e in pool.currents[1:])  # they step side by side
    cores = [e._engine.engine_core for e in (*pool.currents, *pool.lagging)]
    pool.close()
    assert all(c.shut for c in cores)  # each EngineCore process is stopped with its engine


def test_a_rank_with_the_wrong_gpus_fails_before_any_engine_starts(stand_in: list[dict[str, Any]]) -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = "0,1,2,3"
    cfg = load_config("smoke", GPU_RANK)
    with pytest.raises(ValueError, match="sees 4 GPU"):
        engine_factory(cfg, Path("/models/m"), None, None, rank=0)()
    assert stand_in == []
    assert rank_devices(cfg, {}, lambda: 6) == ["0,1", "2,3", "4,5"]  # unset: the node's GPUs, counted


def test_cpu_engines_stay_in_this_process(stand_in: list[dict[str, Any]]) -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = "7"
    cfg = load_config("smoke", ["cluster.rollout.engines_per_rank=2", "cluster.rollout.lagging_engines_per_rank=1"])
    pool = engine_factory(cfg, Path("/models/m"), None, None, rank=3)()
    assert [b["env"]["CUDA_VISIBLE_DEVICES"] for b in stand_in] == ["7"] * 3  # untouched
    assert [b["env"]["VLLM_ENABLE_V1_MULTIPROCESSING"] for b in stand_in] == ["0"] * 3
    assert all("gpu_memory_utilization" not in b and b["dtype"] == "float32" for b in stand_in)
    assert [e.engine_id for e in pool.currents] == [6, 7] and [e.engine_id for e in pool.lagging] == [1003]
    assert all(e.devices is None for e in pool.currents) and pool.currents[0]._lock is pool.currents[1]._lock
    pool.close()


def test_the_weight_swap_of_an_own_process_engine_travels_as_a_pickled_loader() -> None:
    """vLLM sends `collective_rpc`'s function with cloudpickle; the worker runs the loader itself."""
    cloudpickle = pytest.importorskip("cloudpickle")
    tensors = {"w": [1.0, 2.0]}
    reload = pickle.loads(cloudpickle.dumps(_reload_in_worker(lambda: iter(tensors.items()))))
    got: list[Any] = []
    reload(SimpleNamespace(reload_weights=lambda weights_iterator: got.extend(weights_iterator)))
    assert got == [("w", [1.0, 2.0])]
