"""Generation engines behind one async interface: token ids in, token ids and log-probs out.

`VLLMEngine` runs vLLM's engine in this process and drives it from one background thread with
continuous batching: agent loops `await generate(...)` from asyncio, the thread adds each request to the
engine as it arrives and steps the engine while any request is unfinished. Weight swaps are queued to the
same thread and run when no request is in flight, so a swap never lands in the middle of a generation.

`ExpertEngine` is not a model: it asks the env for the task's scripted expert message and returns its
tokens (log-prob 0), so warm-start demonstrations go through exactly the same agent loop as RL data.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class SamplingConfig:
    max_new_tokens: int
    temperature: float
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]  # behaviour log-prob of each sampled token
    finish_reason: str  # "stop" (hit a stop token, included in token_ids) | "length"
    version: int  # weight version that sampled every token of this generation


class Engine(Protocol):
    engine_id: int
    version: int

    async def generate(self, prompt_ids: list[int], sampling: SamplingConfig, **context: Any) -> Generation: ...


class VLLMEngine:
    """vLLM in-process, continuous batching from one thread; `load_weights` swaps between requests."""

    def __init__(self, model_dir: str, max_model_len: int, max_num_seqs: int = 256, kv_cache_gib: int = 1,
                 seed: int = 0, engine_id: int = 0, version: int = 0, dtype: str = "float32") -> None:
        # In-process engine: the weight-swap callable below is then not pickled, and start-up is 2x faster.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from vllm import LLM

        # processed_logprobs: log-probs of the distribution actually sampled from (after temperature),
        # which is what the PPO ratio's denominator must be.
        self._llm = LLM(model=model_dir, dtype=dtype, max_model_len=max_model_len, enforce_eager=True,
                        max_num_seqs=max_num_seqs, seed=seed, logprobs_mode="processed_logprobs")
        self._engine = self._llm.llm_engine
        self.engine_id = engine_id
        self.version = version
        self._ids = itertools.count()
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._pending: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future[Generation], int]] = {}
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=f"vllm-engine-{engine_id}", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- asyncio side
    async def generate(self, prompt_ids: list[int], sampling: SamplingConfig, **context: Any) -> Generation:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Generation] = loop.create_future()
        self._inbox.put(("generate", (f"req-{next(self._ids)}", list(prompt_ids), sampling, loop, fut)))
        return await fut

    async def load_weights(self, weights: Callable[[], Any], version: int) -> None:
        """Swap in new weights once no request is in flight. `weights()` yields (name, tensor) pairs."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._inbox.put(("load", (weights, version, loop, fut)))
        await fut

    def close(self) -> None:
        self._stop = True
        self._inbox.put(("stop", None))
        self._thread.join(timeout=30)

    # ---------------------------------------------------------------- engine thread
    def _run(self) -> None:
        deferred: list[tuple[str, Any]] = []  # requests that arrived while a swap waits for the engine to drain
        swap: tuple[str, Any] | None = None
        while not self._stop:
            busy = self._engine.has_unfinished_requests()
            if not busy and swap is None:
                item: tuple[str, Any] | None = self._inbox.get()  # idle: sleep until work arrives
            else:
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    item = None
            while item is not None:
                kind, payload = item
                if kind == "stop":
                    return
                if kind == "load":
                    swap = item
                elif swap is not None:
                    deferred.append(item)
                else:
                    self._add(payload)
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    item = None
            if swap is not None and not self._engine.has_unfinished_requests():
                self._swap(swap[1])
                swap = None
                for d in deferred:
                    self._add(d[1])
                deferred.clear()
            if self._engine.has_unfinished_requests():
                try:
                    outputs = self._engine.step()
                except Exception as e:  # fail every waiter rather than hang them
                    self._fail_all(e)
                    continue
                for out in outputs:
                    if out.finished:
                        self._finish(out)

    def _add(self, payload: Any) -> None:
        from vllm import SamplingParams

        req_id, prompt, s, loop, fut = payload
        params = SamplingParams(max_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p,
                                logprobs=0, stop_token_ids=list(s.stop_token_ids), seed=s.seed,
                                skip_special_tokens=False)
        try:
            self._engine.add_request(req_id, {"prompt_token_ids": prompt}, params)
        except Exception as e:  # e.g. prompt longer than max_model_len
            loop.call_soon_threadsafe(_set_exception, fut, e)
            return
        self._pending[req_id] = (loop, fut, self.version)

    def _finish(self, out: Any) -> None:
        loop, fut, version = self._pending.pop(out.request_id)
        c = out.outputs[0]
        ids = list(c.token_ids)
        lps = [lp[t].logprob for t, lp in zip(ids, c.logprobs)]
        gen = Generation(ids, lps, "stop" if c.finish_reason == "stop" else "length", version)
        loop.call_soon_threadsafe(_set_result, fut, gen)

    def _swap(self, payload: Any) -> None:
        weights, version, loop, fut = payload
        try:
            items = list(weights())
            self._llm.collective_rpc(lambda worker: worker.reload_weights(weights_iterator=iter(items)))
            self._llm.reset_prefix_cache()  # cached KV was computed by the old weights
            self.version = version
        except Exception as e:
            loop.call_soon_threadsafe(_set_exception, fut, e)
            return
        loop.call_soon_threadsafe(_set_result, fut, None)

    def _fail_all(self, e: Exception) -> None:
        for req_id, (loop, fut, _) in list(self._pending.items()):
            loop.call_soon_threadsafe(_set_exception, fut, e)
            self._engine.abort_request([req_id])
        self._pending.clear()


def _set_result(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future[Any], e: BaseException) -> None:
    if not fut.done():
        fut.set_exception(e)


class ExpertEngine:
    """The task's scripted expert as an engine: asks the env for the expert's message, returns its tokens."""

    def __init__(self, client: Any, tokenizer: Any, engine_id: int = -2) -> None:
        from agentrl.rollout.chat import render_assistant_body

        self._client = client
        self._tok = tokenizer
        self._render = render_assistant_body
        self.engine_id = engine_id
        self.version = -1

    async def generate(self, prompt_ids: list[int], sampling: SamplingConfig, **context: Any) -> Generation:
        msg = await self._client.expert(context["session_id"])
        ids = self._tok.encode(self._render(msg), add_special_tokens=False)
        return Generation(ids, [0.0] * len(ids), "stop", self.version)


class ScriptedEngine:
    """Replies with fixed texts, one per turn, in order (for tests and dry runs of an env).

    Log-probs are a fixed -1.0 per token so that tests can tell sampled tokens from context tokens.
    """

    def __init__(self, replies: list[str], tokenizer: Any, engine_id: int = 7, version: int = 3) -> None:
        self._replies = list(replies)
        self._tok = tokenizer
        self.engine_id = engine_id
        self.version = version
        self.prompts: list[list[int]] = []

    async def generate(self, prompt_ids: list[int], sampling: SamplingConfig, **context: Any) -> Generation:
        self.prompts.append(list(prompt_ids))
        text = self._replies.pop(0)
        ids = self._tok.encode(text, add_special_tokens=False)[: sampling.max_new_tokens]
        stopped = bool(ids) and ids[-1] in sampling.stop_token_ids
        return Generation(ids, [-1.0] * len(ids), "stop" if stopped else "length", self.version)
