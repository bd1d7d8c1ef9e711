"""A running vLLM engine (CPU build) samples with the trainer's new weights after a swap, by both publishing
paths: v1 through the versioned safetensors directory, v2 through the in-job broadcast. The engine's
behaviour log-probs of what it sampled must equal the trainer's log-probs of the same tokens under that
version (the PPO ratio's denominator), and differ from the previous version's."""
from __future__ import annotations

import asyncio
import copy
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from agentrl.config import TrainerConfig
from agentrl.models import tiny
from agentrl.rollout.engine import SamplingConfig, VLLMEngine
from agentrl.trainer.batch import collate
from agentrl.trainer.learner import publish_weights
from agentrl.trainer.logprobs import token_logprobs
from agentrl.trainer.model_load import load_model
from agentrl.trainer.parallel import Parallel
from agentrl.trainer.step import warm_start_step
from agentrl.transport import weights
from agentrl.transport.broadcast import WeightBroadcast, open_store
from agentrl.types import Status, TrajectoryBuilder

pytest.importorskip("vllm")
PROMPT = [5, 17, 42, 99, 7, 64, 33, 8]


def _trainer_update(model: torch.nn.Module, target: list[int]) -> None:
    """A few supervised steps towards `target` after PROMPT: new weights, far from the old ones."""
    b = TrajectoryBuilder()
    b.add_context(PROMPT)
    b.add_action(target, [0.0] * len(target), 0, 0)
    t = b.build(traj_id="x", task="t", index="0", group_id="g", reward=0.0, status=Status.COMPLETED, num_turns=1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(5):
        warm_start_step(model, opt, collate([t], [0.0], pad_id=1), TrainerConfig(grad_clip=1.0, micro_batch_tokens=4096))


def _hf_logprobs(model: torch.nn.Module, generated: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logp, _ = token_logprobs(model, torch.tensor([PROMPT + generated]), None)
    return logp[0, len(PROMPT) - 1:]  # [len(generated)]: the targets that were sampled


def _release_vllm_process_group() -> None:
    """vLLM in this process made itself torch.distributed's default group (world size 1): drop it, or the
    tests after this one would inherit it (a data-parallel trainer must start its own)."""
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    destroy_model_parallel()
    destroy_distributed_environment()
    assert not torch.distributed.is_initialized()


@pytest.fixture
def own_environ() -> Iterator[None]:
    """vLLM writes to os.environ (LD_PRELOAD, VLLM_*), which every later child process would inherit: undo it."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_engine_samples_with_each_new_version(tmp_path: Path, own_environ: None) -> None:
    corpus = [f"look up {i} and answer {i * 3}" for i in range(60)]
    tok = tiny.train_tokenizer(corpus, 300, ["<|end|>", "<|pad|>"], "{{ messages }}", "<|end|>", "<|pad|>")
    model_dir = tiny.save(tiny.build_model(tok, 128, 1, 2, 256, 128, seed=0), tok, tmp_path / "model")
    trainer_model = load_model(model_dir, torch.get_num_threads())
    versions = {0: copy.deepcopy(trainer_model)}
    engine = VLLMEngine(str(model_dir), max_model_len=128, max_num_seqs=4, kv_cache_gib=1, seed=0)
    sampling = SamplingConfig(max_new_tokens=12, temperature=1.0, seed=0)
    try:
        # v1 through the run dir, as between jobs
        _trainer_update(trainer_model, [60, 61, 62, 63, 64, 65])
        versions[1] = copy.deepcopy(trainer_model)
        publish_weights(tmp_path / "run", 1, trainer_model, Parallel())
        path = weights.wait_for(tmp_path / "run", 1, timeout_s=5)
        asyncio.run(engine.load_weights(lambda: weights.iter_weights(path), 1))
        gen1 = asyncio.run(engine.generate(PROMPT, sampling))

        # v2 through the in-job broadcast: the trainer's rank 0 sends from a thread of its own
        _trainer_update(trainer_model, [70, 71, 72, 73, 74, 75])
        versions[2] = copy.deepcopy(trainer_model)
        master = open_store("127.0.0.1", 0, 0, 2, timeout_s=60)
        sent: list[BaseException] = []

        def send() -> None:
            try:
                WeightBroadcast(master, 0, 2, timeout_s=60).send(2, trainer_model.state_dict().items())
            except BaseException as e:  # noqa: BLE001 - reported below
                sent.append(e)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        version, named = WeightBroadcast(open_store("127.0.0.1", master.port, 1, 2, timeout_s=60), 1, 2,
                                         timeout_s=60).receive()
        sender.join(timeout=60)
        assert not sent and version == 2 and any(n == "lm_head.weight" for n, _ in named)
        asyncio.run(engine.load_weights(lambda: iter(named), version))
        gen2 = asyncio.run(engine.generate(PROMPT, sampling))
    finally:
        engine.close()
        _release_vllm_process_group()

    for v, gen in ((1, gen1), (2, gen2)):
        assert gen.version == v and len(gen.token_ids) > 0
        engine_lp = torch.tensor(gen.logprobs)
        now = (_hf_logprobs(versions[v], gen.token_ids) - engine_lp).abs().max()
        before = (_hf_logprobs(versions[v - 1], gen.token_ids) - engine_lp).abs().max()
        assert now < 1e-3, (v, now)
        assert before > 0.05, (v, before)  # the previous version would not have given these log-probs


def test_an_in_process_engine_runs_after_the_process_changed_torchs_thread_count(tmp_path: Path,
                                                                                  own_environ: None) -> None:
    """A model loaded in this process with one trainer thread (`load_model(dir, 1)`) leaves torch on one thread;
    vLLM's CPU attention plans for the process's default and failed every step ("Check failed:
    input->metadata->thread_num == thread_num (2 vs. 1)"). The engine puts the default back before it starts."""
    corpus = [f"look up {i} and answer {i * 3}" for i in range(60)]
    tok = tiny.train_tokenizer(corpus, 300, ["<|end|>", "<|pad|>"], "{{ messages }}", "<|end|>", "<|pad|>")
    model_dir = tiny.save(tiny.build_model(tok, 128, 1, 2, 256, 128, seed=0), tok, tmp_path / "model")
    default = int(os.environ.get("OMP_NUM_THREADS") or len(os.sched_getaffinity(0)))
    if default < 2:
        pytest.skip("one CPU: any thread count is the default")
    load_model(model_dir, 1)
    torch._C.set_num_threads(1)  # as load_model does, unless an earlier engine here made torch.set_num_threads a no-op
    assert torch.get_num_threads() == 1
    engine = VLLMEngine(str(model_dir), max_model_len=128, max_num_seqs=4, kv_cache_gib=1, seed=0)
    try:
        gen = asyncio.run(engine.generate(PROMPT, SamplingConfig(max_new_tokens=4, temperature=1.0, seed=0)))
    finally:
        engine.close()
        _release_vllm_process_group()
    assert len(gen.token_ids) > 0 and torch.get_num_threads() == default
