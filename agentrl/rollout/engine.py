"""Generation engines behind one async interface: token ids in, token ids and log-probs out.

`VLLMEngine` runs vLLM's engine in this process and drives it from one background thread with
continuous batching: agent loops `await generate(...)` from asyncio, the thread adds each request to the
engine as it arrives and steps the engine while any request is unfinished. Weight swaps are queued to the
same thread and run when no request is in flight, so a swap never lands in the middle of a generation.
Several VLLMEngines may live in one process (a rank's current and lagging engines, `engine_pool`). On CPU they
run in this process: vLLM keeps the forward pass's context in module globals, so their threads take turns
(`_VLLM_LOCK`) for every step, swap and start-up. On GPUs each runs in its own EngineCore process on its own
slice of the rank's GPUs (`devices`, from `placement`), and their threads step them in parallel.

`ExpertEngine` is not a model: it asks the env for the task's scripted expert message and returns its
tokens (log-prob 0), so warm-start demonstrations go through exactly the same agent loop as RL data.
"""
from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from agentrl.tasks.api import EnvError

# vLLM's forward context and current config are module globals: two in-process engines must not run a forward
# pass (or load weights) at the same time. On CPU they share the cores anyway. Every engine's start-up holds it
# too: an engine of its own process is started with its own CUDA_VISIBLE_DEVICES in os.environ.
_VLLM_LOCK = threading.Lock()
T = TypeVar("T")


@contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    """os.environ with `values` set, restored afterwards (a process started meanwhile inherits them)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def own_process_env(devices: str) -> dict[str, str]:
    """The environment an engine of its own process is started with (`VLLMEngine`, `devices` given).

    V1 multiprocessing on: `LLM(...)` starts an EngineCore process, which (with its tensor-parallel workers)
    sees only `devices` (engine device i is `devices`' i-th GPU) and reads the variable when it initialises
    CUDA, after this process has started it. Spawned, not forked: a rollout rank runs threads (the engines
    started before, the weight receiver, the event loop) whose locks a forked child would inherit held."""
    return {"CUDA_VISIBLE_DEVICES": devices, "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
            "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}


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
    engine_id: int  # the engine that sampled it (set by that engine: a router in front stays race-free)


@dataclass
class Handoff:
    """Time requests spend crossing between the agent loops' event loop and the engine thread (not generating).

    `to_engine_s`: from `generate` being called to the request entering vLLM (the engine thread picks up new
    requests between two steps, so this includes waiting for the step in progress). `to_loop_s`: from vLLM
    finishing a request to its agent loop running again (the event loop's wake-up and whatever it was doing).
    """

    requests: int = 0
    to_engine_s: float = 0.0
    to_loop_s: float = 0.0

    def count(self, to_engine_s: float, to_loop_s: float) -> None:
        self.requests += 1
        self.to_engine_s += to_engine_s
        self.to_loop_s += to_loop_s


def vllm_sampling_params(s: SamplingConfig, **extra: Any) -> Any:
    """vLLM's parameters for one request of ours (`extra`: more `SamplingParams` fields, e.g. for a benchmark).

    Beside the sampling settings, three choices cut the engine thread's Python work per step without changing
    a sampled token or log-prob: `FINAL_ONLY` (one output when the request ends, instead of a cumulative copy
    of its tokens and log-probs built at every step: we read only the finished one), no detokenization (the
    agent loop decodes the ids once, in `ChatFormat.parse`; vLLM would otherwise decode every new token and
    every log-prob's token as it goes) and flat log-probs (a few flat lists instead of one dict per token).
    """
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(max_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p, logprobs=0,
                          stop_token_ids=list(s.stop_token_ids), seed=s.seed, skip_special_tokens=False,
                          detokenize=False, flat_logprobs=True, output_kind=RequestOutputKind.FINAL_ONLY,
                          **extra)


def sampled_logprobs(ids: list[int], logprobs: Any) -> list[float]:
    """The log-prob of each sampled token from vLLM's per-position log-probs (asked with `logprobs=0`, so each
    position holds the sampled token alone): flat (`FlatLogprobs`, one entry per position) or one dict per
    position, as vLLM returns them."""
    flat = getattr(logprobs, "start_indices", None)
    if flat is not None:
        if logprobs.token_ids == ids:  # one entry per position, each the sampled token's
            return list(logprobs.logprobs)
        return [logprobs.logprobs[i] for i in flat]  # the sampled token comes first at each position
    return [lp[t].logprob for t, lp in zip(ids, logprobs)]


class Engine(Protocol):
    engine_id: int
    version: int

    async def generate(self, prompt_ids: list[int], sampling: SamplingConfig, **context: Any) -> Generation: ...


def _restore_cpu_threads() -> None:
    """Put torch's intra-op thread count back to the process's default before an in-process CPU engine starts.

    vLLM's CPU attention plans its work for the OpenMP threads a new thread starts with (OMP_NUM_THREADS, else
    every CPU this process may use) and aborts the whole process (`cpu_attn_impl.hpp: Check failed:
    input->metadata->thread_num == thread_num`) when torch runs the step on another count. Other code in the
    process may have changed torch's count (a model loaded with `trainer.threads`, a benchmark); vLLM's CPU
    worker replaces `torch.set_num_threads` with a no-op, so the count is set through torch's binding.
    """
    import logging

    import torch

    want = int(os.environ.get("OMP_NUM_THREADS") or len(os.sched_getaffinity(0)))
    if torch.get_num_threads() != want:
        logging.getLogger("agentrl.rollout.engine").warning(
            "torch ran %d intra-op threads; the in-process vLLM CPU engine needs the default %d: set back",
            torch.get_num_threads(), want)
        torch._C.set_num_threads(want)  # the binding itself: vLLM may have replaced torch.set_num_threads


class VLLMEngine:
    """vLLM driven from one thread with continuous batching; `load_weights` swaps between requests.

    If the engine thread fails, every waiting and later call raises instead of hanging.
    """

    def __init__(self, model_dir: str, max_model_len: int, max_num_seqs: int = 256, kv_cache_gib: int = 1,
                 seed: int = 0, engine_id: int = 0, version: int = 0, dtype: str = "float32",
                 enforce_eager: bool = True, tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float | None = None, kv_cache_memory_bytes: int | None = None,
                 linger_s: float = 0.0, devices: str | None = None) -> None:
        """The defaults are the CPU engine's (float32, eager, `kv_cache_gib` of KV cache). On GPUs,
        `gpu_memory_utilization` is this engine's share of each of its GPUs and `kv_cache_memory_bytes`, when
        given, sizes its KV cache instead of that share's remainder (None: vLLM's own defaults). `linger_s`:
        after a step that finished requests, at most how long the engine thread waits for their agent loops to
        react (ask for their next turn, or start waiting on the env) before its next step (`_linger`; 0: step at
        once, the default: not yet measured in the pipeline, whose envs answer after their own latency).

        `devices` None (CPU): vLLM runs in this process (the weights to swap in are then handed over as they
        are, and start-up is 2x faster). `devices` a CUDA_VISIBLE_DEVICES value (GPU nodes, one slice of the
        rank's GPUs per engine, `agentrl.rollout.placement`): the engine runs in its own EngineCore process on
        those GPUs only (`own_process_env`), so `gpu_memory_utilization` is its share of GPUs no other engine
        of the rank uses, and its steps run beside the other engines' instead of taking turns with them."""
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        scoped: dict[str, str] = {}
        if devices is None:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            _restore_cpu_threads()
        else:
            scoped = own_process_env(devices)
            # The weight swap sends a function to the engine's process (`_swap`); vLLM serializes functions
            # (with cloudpickle) only when this is set, here and in that process.
            os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        from vllm import LLM

        gpu: dict[str, Any] = {}
        if gpu_memory_utilization is not None:
            gpu["gpu_memory_utilization"] = gpu_memory_utilization
        if kv_cache_memory_bytes is not None:
            gpu["kv_cache_memory_bytes"] = kv_cache_memory_bytes
        # processed_logprobs: log-probs of the distribution actually sampled from (after temperature),
        # which is what the PPO ratio's denominator must be.
        with _VLLM_LOCK, _environ(scoped):
            self._llm = LLM(model=model_dir, dtype=dtype, max_model_len=max_model_len, enforce_eager=enforce_eager,
                            tensor_parallel_size=tensor_parallel_size, max_num_seqs=max_num_seqs, seed=seed,
                            logprobs_mode="processed_logprobs", **gpu)
        self._engine = self._llm.llm_engine
        self.devices = devices
        core = getattr(self._engine, "engine_core", None)  # vLLM's client of its EngineCore (None: a stand-in)
        in_process = devices is None if core is None else type(core).__name__ == "InprocClient"
        if in_process != (devices is None):  # e.g. vLLM's environment cache, frozen by an earlier in-process engine
            self._shutdown()
            raise RuntimeError(f"vLLM engine {engine_id}: asked to run " + (
                "in this process" if devices is None else f"in its own process on GPUs {devices}") +
                f" but vLLM ran it {'in this process' if in_process else 'in its own'}"
                " (VLLM_ENABLE_V1_MULTIPROCESSING as vLLM read it)")
        # Steps and swaps of in-process engines take turns (module globals); an own-process engine's are its own.
        self._lock = _VLLM_LOCK if in_process else threading.Lock()
        self.engine_id = engine_id
        self.version = version
        self.linger_s = linger_s
        self._marks = 0
        self._ids = itertools.count()
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._pending: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future[Any], int]] = {}
        self._waiting: list[tuple[str, Any]] = []  # requests held back while a swap waits for the drain
        self._jobs: collections.deque[Any] = collections.deque()  # swaps and `run_idle` calls, in order asked
        self._error: BaseException | None = None
        self.handoff = Handoff()
        self._thread = threading.Thread(target=self._run, name=f"vllm-engine-{engine_id}", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- asyncio side
    async def generate(self, prompt_ids: list[int], sampling: SamplingConfig, **context: Any) -> Generation:
        t0 = time.perf_counter()
        fut = self._submit("generate", lambda loop, fut: (f"req-{next(self._ids)}", list(prompt_ids), sampling,
                                                          loop, fut))
        gen, added, finished = await fut
        self.handoff.count(added - t0, time.perf_counter() - finished)
        return gen

    async def load_weights(self, weights: Callable[[], Any], version: int) -> None:
        """Swap in new weights once no request is in flight. `weights()` yields (name, tensor) pairs.

        Swaps apply in the order asked; requests that arrive meanwhile wait and then use the new weights.
        """
        await self._submit("idle", lambda loop, fut: (functools.partial(self._swap, weights, version), loop, fut))

    async def run_idle(self, fn: Callable[[Any], T]) -> T:
        """Run `fn(llm)` (the `vllm.LLM`) on the engine thread once no request is in flight, as a swap runs; requests
        that arrive meanwhile wait for it. For work that must own the engine between generations: the agent-loop
        benchmark replays raw vLLM on the very engine our loop used (`jobs.bench_agent_loop`)."""
        def job() -> T:
            with self._lock:  # in-process engines step in turns (vLLM's module globals)
                return fn(self._llm)

        return await self._submit("idle", lambda loop, fut: (job, loop, fut))

    def close(self) -> None:
        """Stop the engine thread; anything still waiting gets an error."""
        if self._thread.is_alive():
            self._inbox.put(("stop", None))
            self._thread.join(timeout=60)
        if self.devices is not None:  # its EngineCore process frees its GPUs now, not when this one exits
            self._shutdown()

    def _shutdown(self) -> None:
        shutdown = getattr(getattr(self._engine, "engine_core", None), "shutdown", None)
        if shutdown is not None:
            try:
                shutdown()
            except Exception:  # noqa: BLE001 - a process already gone is the outcome wanted
                pass

    def _submit(self, kind: str, make: Callable[[Any, Any], Any]) -> asyncio.Future[Any]:
        if self._error is not None or not self._thread.is_alive():
            raise RuntimeError(f"vLLM engine {self.engine_id} is not running") from self._error
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        payload = make(loop, fut)
        if kind == "generate":  # a cancelled caller frees its sequence slot
            fut.add_done_callback(lambda f, rid=payload[0]: f.cancelled() and self._inbox.put(("abort", rid)))
        self._inbox.put((kind, payload))
        return fut

    # ---------------------------------------------------------------- engine thread
    def _run(self) -> None:
        try:
            self._serve()
            self._fail_all(RuntimeError(f"vLLM engine {self.engine_id} was closed"))
        except BaseException as e:  # noqa: BLE001 - any failure must reach the waiters, not kill them silently
            self._error = e
            self._fail_all(e)

    def _serve(self) -> None:
        while True:
            idle = not self._engine.has_unfinished_requests() and not self._jobs
            try:
                item: tuple[str, Any] | None = self._inbox.get(block=idle)
            except queue.Empty:
                item = None
            while item is not None:
                if not self._take(item):
                    return
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    item = None
            if self._jobs and not self._engine.has_unfinished_requests():
                while self._jobs:
                    self._run_job(self._jobs.popleft())
                for payload in self._waiting:
                    self._add(payload)
                self._waiting.clear()
            if self._engine.has_unfinished_requests():
                with self._lock:
                    outs = self._engine.step()
                loops = {self._finish(out) for out in outs if out.finished} - {None}
                if loops and self.linger_s > 0 and not self._linger(loops):
                    return

    def _take(self, item: tuple[str, Any]) -> bool:
        """Act on one inbox item; False: stop."""
        kind, payload = item
        if kind == "stop":
            return False
        if kind == "mark":  # a `_linger` round's marker that came after its wait ended
            pass
        elif kind == "idle":
            self._jobs.append(payload)
        elif kind == "abort":
            if self._pending.pop(payload, None) is not None:
                self._engine.abort_request([payload])
        elif self._jobs:
            self._waiting.append(payload)
        else:
            self._add(payload)
        return True

    def _linger(self, loops: set[Any]) -> bool:
        """After a step that finished requests, let their agent loops react before the next step, so that a next
        turn asked for at once joins that step instead of the one after: each event loop in `loops` gets a
        marker that it puts into the inbox after one round of its ready callbacks (the woken episodes ran up to
        their next await: a new request, or an env call that takes its time), and the engine thread takes the
        inbox's items until every marker is back or `linger_s` passed. False: stop."""
        self._marks += 1
        mark = ("mark", self._marks)
        for loop in loops:
            try:  # two hops: the first runs before the woken episodes' steps, the one it queues after them
                loop.call_soon_threadsafe(lambda lp=loop: lp.call_soon(self._inbox.put, mark))
            except RuntimeError:  # that event loop is closed
                return True
        deadline, back = time.perf_counter() + self.linger_s, 0
        while back < len(loops):
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            try:
                item = self._inbox.get(timeout=left)
            except queue.Empty:
                break
            if item == mark:
                back += 1
            elif not self._take(item):
                return False
        return True

    def _add(self, payload: Any) -> None:
        req_id, prompt, s, loop, fut = payload
        try:
            self._engine.add_request(req_id, {"prompt_token_ids": prompt}, vllm_sampling_params(s))
        except Exception as e:  # a bad request (e.g. a prompt over max_model_len) fails alone
            loop.call_soon_threadsafe(_set_exception, fut, e)
            return
        self._pending[req_id] = (loop, fut, self.version, time.perf_counter())

    def _finish(self, out: Any) -> Any:
        """Hand a finished request's generation to its caller; returns the caller's event loop (None: aborted)."""
        entry = self._pending.pop(out.request_id, None)
        if entry is None:  # aborted meanwhile
            return None
        loop, fut, version, added = entry
        c = out.outputs[0]
        ids = list(c.token_ids)
        gen = Generation(ids, sampled_logprobs(ids, c.logprobs), "stop" if c.finish_reason == "stop" else "length",
                         version, self.engine_id)
        loop.call_soon_threadsafe(_set_result, fut, (gen, added, time.perf_counter()))
        return loop

    def _run_job(self, payload: Any) -> None:
        job, loop, fut = payload
        try:
            result = job()
        except Exception as e:
            loop.call_soon_threadsafe(_set_exception, fut, e)
            return
        loop.call_soon_threadsafe(_set_result, fut, result)

    def _swap(self, weights: Callable[[], Any], version: int) -> None:
        if self.devices is None:  # in-process: the tensors are handed over as they are
            items = list(weights())

            def reload(worker: Any) -> None:
                _rotary_caches_are_not_weights()
                worker.reload_weights(weights_iterator=iter(items))
        else:  # the loader itself goes to the engine's workers (pickled), which read the weights there
            reload = _reload_in_worker(weights)
        with self._lock:
            self._llm.collective_rpc(reload)
            self._llm.reset_prefix_cache()  # cached KV was computed by the old weights
        self.version = version

    def _fail_all(self, e: BaseException) -> None:
        """Hand `e` to every waiter first (aborting can itself fail when the engine is broken)."""
        waiters = [(entry[0], entry[1]) for entry in self._pending.values()]
        waiters += [(p[3], p[4]) for p in self._waiting] + [(p[1], p[2]) for p in self._jobs]
        while True:
            try:
                kind, p = self._inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "generate":
                waiters.append((p[3], p[4]))
            elif kind == "idle":
                waiters.append((p[1], p[2]))
        for loop, fut in waiters:
            try:
                loop.call_soon_threadsafe(_set_exception, fut, e)
            except RuntimeError:  # that event loop is already closed
                pass
        ids = list(self._pending)
        self._pending.clear()
        self._waiting.clear()
        self._jobs.clear()
        try:
            self._engine.abort_request(ids)
        except Exception:  # noqa: BLE001 - the engine is going away either way
            pass


def _reload_in_worker(weights: Callable[[], Any]) -> Callable[[Any], None]:
    """What an own-process engine's workers run for a swap: `weights()` there, into the worker's model.

    vLLM sends it to them with cloudpickle, closure included: a loader of a weights directory
    (`weight_sources.DirWeights`) travels as the directory's name and each worker reads the files; a loader of
    tensors held in memory (the broadcast's) travels with its tensors."""
    def reload(worker: Any) -> None:
        _rotary_caches_are_not_weights()
        worker.reload_weights(weights_iterator=iter(weights()))
    return reload


ROTARY_CACHES = ("cos_sin_cache", "cos_sin_cache_bf16", "long_short_cos_sin_cache", "cos_sin_q_cache",
                 "cos_sin_qc_cache", "cos_sin_k_cache", "cos_sin_q_inter_cache", "cos_sin_qc_no_clamp_cache",
                 "inv_freq")
"""The buffers vLLM's rotary embeddings compute from the config (`vllm/model_executor/layers/rotary_embedding/`):
never in a checkpoint, never sent by the trainer."""


def _rotary_caches_are_not_weights() -> None:
    """Tell vLLM's layerwise reload (`reload_weights`) that the rotary caches are not weights to wait for.

    It counts every parameter and buffer of a layer as loadable; a rotary embedding has no parameters, only its
    cos/sin cache, which no checkpoint holds, so at each swap every one logged `RotaryEmbedding: Failed to load
    weights` and put its own cache back (`_place_kernel_tensors`). That fallback is what happens either way; with
    the caches in vLLM's own skip list (`SKIP_LOAD_TENSORS`, the set it keeps for MoE expert maps) the layer
    simply has nothing to load. Runs where the weights are loaded: in this process, or in the engine's own."""
    try:
        from vllm.model_executor.model_loader.reload.meta import SKIP_LOAD_TENSORS
    except ImportError:  # a vLLM without layerwise reload: nothing counts the caches
        return
    SKIP_LOAD_TENSORS.update(ROTARY_CACHES)


def _set_result(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future[Any], e: BaseException) -> None:
    if not fut.done():
        fut.set_exception(e)


class ExpertEngine:
    """The task's scripted expert as an engine: asks the env for the expert's message and returns it as the
    model would write it in its own chat format (`ChatFormat.assistant_ids`, the `fmt` the agent loop passes)."""

    def __init__(self, client: Any, engine_id: int = -2) -> None:
        self._client = client
        self.engine_id = engine_id
        self.version = -1

    async def generate(self, prompt_ids: list[int], sampling: SamplingConfig, **context: Any) -> Generation:
        msg = await self._client.expert(context["session_id"])
        try:
            ids = context["fmt"].assistant_ids(msg, context.get("tools"))
        except Exception as e:  # a message the chat template cannot render is the env's (its expert's) failure
            raise EnvError("env_error", f"the expert's message cannot be rendered: {type(e).__name__}: "
                                        f"{str(e)[:200]}") from e
        return Generation(ids, [0.0] * len(ids), "stop", self.version, self.engine_id)

    async def load_weights(self, weights: Callable[[], Any], version: int) -> None:
        """The expert has no weights; it only takes the version, so trajectories record it."""
        self.version = version

    def close(self) -> None:
        pass
