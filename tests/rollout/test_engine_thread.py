"""`VLLMEngine`'s engine thread against a stand-in for vLLM's `LLMEngine` (one token per request per step):
results and log-probs reach their asyncio callers, hand-offs are counted, and lingering lets an episode's next
turn join the very next step. Milliseconds, no vLLM (tests/rollout/test_weight_swap.py runs the real one)."""
from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
import types
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from agentrl.rollout.engine import SamplingConfig, VLLMEngine, sampled_logprobs


class FakeCore:
    """vLLM's `LLMEngine` interface: request r generates tokens 100+k (k = its step count), log-prob -k/10."""

    def __init__(self) -> None:
        self.running: dict[str, tuple[list[int], Any, list[int]]] = {}
        self.steps = 0
        self.step_s = 0.0
        self.adds: list[tuple[str, int]] = []  # (request id, steps done when it was added)
        self.lock = threading.Lock()

    def add_request(self, rid: str, prompt: dict[str, Any], params: Any) -> None:
        with self.lock:
            self.adds.append((rid, self.steps))
            self.running[rid] = (prompt["prompt_token_ids"], params, [])

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def abort_request(self, ids: list[str]) -> None:
        for i in ids:
            self.running.pop(i, None)

    def step(self) -> list[Any]:
        time.sleep(self.step_s)  # a forward pass (sleeping releases the GIL, as torch's kernels do)
        with self.lock:
            self.steps += 1
            outs = []
            for rid, (_, params, toks) in list(self.running.items()):
                toks.append(100 + len(toks))
                if len(toks) < params.max_tokens:
                    continue
                del self.running[rid]
                flat = SimpleNamespace(start_indices=list(range(len(toks))), token_ids=list(toks),
                                       logprobs=[-k / 10 for k in range(len(toks))])
                c = SimpleNamespace(token_ids=list(toks), logprobs=flat, finish_reason="length")
                outs.append(SimpleNamespace(request_id=rid, finished=True, outputs=[c]))
        return outs


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    saved = dict(os.environ)
    vllm = types.ModuleType("vllm")
    vllm.LLM = lambda **kw: SimpleNamespace(llm_engine=FakeCore())  # type: ignore[attr-defined]
    vllm.SamplingParams = lambda **kw: SimpleNamespace(**kw)  # type: ignore[attr-defined]
    sp = types.ModuleType("vllm.sampling_params")
    sp.RequestOutputKind = SimpleNamespace(FINAL_ONLY=2)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sp)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_generations_come_back_with_their_logprobs_and_the_params_ask_for_final_outputs(fake_vllm: None) -> None:
    engine = VLLMEngine("/m", 64, engine_id=3, version=5)
    try:
        async def main() -> list[Any]:
            return await asyncio.gather(*(engine.generate([1, 2], SamplingConfig(n, 1.0)) for n in (2, 4)))

        a, b = asyncio.run(main())
    finally:
        engine.close()
    assert a.token_ids == [100, 101] and b.token_ids == [100, 101, 102, 103]
    assert b.logprobs == [0.0, -0.1, -0.2, -0.3] and (b.version, b.engine_id, b.finish_reason) == (5, 3, "length")
    assert engine.handoff.requests == 2 and engine.handoff.to_engine_s >= 0 and engine.handoff.to_loop_s >= 0


def test_lingering_puts_the_next_turn_into_the_next_step(fake_vllm: None) -> None:
    engine = VLLMEngine("/m", 64, linger_s=0.3)
    core = engine._engine
    core.step_s = 0.005
    try:
        async def episode() -> None:
            await asyncio.sleep(0.03)  # the long request below is in the engine first
            for _ in range(4):
                await engine.generate([1], SamplingConfig(2, 1.0))

        async def main() -> None:
            # a long request keeps the engine stepping while the episode's turns come and go
            await asyncio.gather(engine.generate([9], SamplingConfig(80, 1.0)), episode())

        asyncio.run(main())
    finally:
        engine.close()
    assert core.adds[0] == ("req-0", 0)
    turns = [step for rid, step in core.adds[1:]]
    # each turn is added right after the step that finished the one before (2 tokens: 2 steps later)
    assert len(turns) == 4 and [b - a for a, b in zip(turns, turns[1:])] == [2, 2, 2]


def test_sampled_logprobs_read_flat_and_per_position_dicts() -> None:
    ids = [7, 8, 9]
    flat = SimpleNamespace(start_indices=[0, 1, 2], token_ids=[7, 8, 9], logprobs=[-0.5, -1.0, -2.0])
    assert sampled_logprobs(ids, flat) == [-0.5, -1.0, -2.0]
    ranked = SimpleNamespace(start_indices=[0, 2, 4], token_ids=[7, 1, 8, 1, 9, 1],
                             logprobs=[-0.5, -0.1, -1.0, -0.1, -2.0, -0.1])  # sampled first, then the top-1
    assert sampled_logprobs(ids, ranked) == [-0.5, -1.0, -2.0]
    dicts = [{7: SimpleNamespace(logprob=-0.5)}, {8: SimpleNamespace(logprob=-1.0), 3: SimpleNamespace(logprob=0.0)},
             {9: SimpleNamespace(logprob=-2.0)}]
    assert sampled_logprobs(ids, dicts) == [-0.5, -1.0, -2.0]


def test_lingering_ends_when_the_loop_waits_on_something_else(fake_vllm: None) -> None:
    """An episode that goes to a slow env after its turn does not hold the engine for `linger_s`: the engine
    steps on as soon as the event loop has run the woken episode up to its next await."""
    engine = VLLMEngine("/m", 64, linger_s=30.0)
    engine._engine.step_s = 0.002
    try:
        async def episode() -> None:
            for _ in range(3):
                await engine.generate([1], SamplingConfig(2, 1.0))
                await asyncio.sleep(0.05)  # the env

        t0 = time.perf_counter()
        asyncio.run(episode())
        took = time.perf_counter() - t0
    finally:
        engine.close()
    assert took < 5.0, took  # 3 lingers of 30 s each otherwise


def test_run_idle_waits_for_the_requests_in_flight_and_owns_the_engine_while_it_runs(fake_vllm: None) -> None:
    """`run_idle(fn)` runs on the engine thread once nothing is generating; a request asked meanwhile waits for it;
    its result and its exception reach the caller, and the engine serves on afterwards."""
    engine = VLLMEngine("/m", 64)
    core = engine._engine
    core.step_s = 0.002
    seen: dict[str, Any] = {}

    def job(llm: Any) -> int:
        seen.update(thread=threading.current_thread().name, running=len(llm.llm_engine.running),
                    steps=llm.llm_engine.steps)
        time.sleep(0.05)  # a request asked now must not be added before this returns
        return 42

    def broken(llm: Any) -> None:
        raise ValueError("bad job")

    try:
        async def main() -> tuple[Any, int, Any]:
            long = asyncio.ensure_future(engine.generate([1], SamplingConfig(10, 1.0)))
            await asyncio.sleep(0.005)  # the request is in the engine before the job is asked for
            idle = asyncio.ensure_future(engine.run_idle(job))
            await asyncio.sleep(0.001)
            later = asyncio.ensure_future(engine.generate([2], SamplingConfig(2, 1.0)))
            gen, result, _ = await asyncio.gather(long, idle, later)
            with pytest.raises(ValueError, match="bad job"):
                await engine.run_idle(broken)
            return gen, result, await engine.generate([3], SamplingConfig(3, 1.0))

        gen, result, after = asyncio.run(main())
    finally:
        engine.close()
    assert result == 42 and seen["thread"].startswith("vllm-engine") and seen["running"] == 0
    assert seen["steps"] == 10 and len(gen.token_ids) == 10  # the first request finished before the job ran
    later_added = dict(core.adds)["req-1"]
    assert later_added >= seen["steps"]  # the request asked during the job was added after it
    assert after.token_ids == [100, 101, 102]


@pytest.mark.parametrize("overrides, want_s", [([], 0.005), (["rollout.linger_ms=0"], 0.0),
                                               (["rollout.linger_ms=12.5"], 0.0125)])
def test_the_configured_linger_reaches_every_engine_of_a_rank(fake_vllm: None, overrides: list[str],
                                                               want_s: float) -> None:
    from pathlib import Path

    from agentrl.config import load_config
    from agentrl.rollout.from_config import engine_factory

    cfg = load_config("smoke", ["cluster.rollout.lagging_engines_per_rank=1", "rollout.lagging_prob=0.25",
                                *overrides])
    pool = engine_factory(cfg, Path("/m"), None, None, rank=0)()
    try:
        assert [e.linger_s for e in [*pool.currents, *pool.lagging]] == [want_s, want_s]
    finally:
        pool.close()


def test_engines_of_their_own_process_do_not_linger() -> None:
    from agentrl.config import load_config

    cfg = load_config("agentbench-qwen2.5-7b", ["rollout.linger_ms=12"])
    assert "linger_s" not in cfg.cluster.rollout.engine_settings(64, cfg.rollout.linger_ms)  # GPU nodes: VLLMEngine's 0
    cpu = load_config("smoke", ["rollout.linger_ms=12"])
    assert cpu.cluster.rollout.engine_settings(64, cpu.rollout.linger_ms)["linger_s"] == pytest.approx(0.012)


def test_a_negative_linger_fails_at_load_naming_the_field() -> None:
    from agentrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="rollout.linger_ms"):
        load_config("smoke", ["rollout.linger_ms=-1"])
