"""Processes for the trainer tests, forked from a clean forkserver that has torch and transformers imported.

Forking the test process itself would skip the imports too, but it inherits whatever earlier tests left
running (vLLM's engine threads and process group, event-loop threads holding locks), and a fork can hang
on those. The forkserver is a fresh interpreter that only imports; each process forks from it in
milliseconds. Targets live here or in `dist_trainer_worker` so that the server can import them.
"""
from __future__ import annotations

import multiprocessing
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

PRELOAD = ["torch", "torch.distributed.fsdp", "torch.distributed.checkpoint", "transformers",
           "transformers.models.qwen2.modeling_qwen2", "agentrl.trainer.learner", "dist_trainer_worker"]


def context() -> Any:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # takes effect when the server starts (the first process)
    return ctx


def _guarded(target: Callable[..., None], errors: Path, name: str, args: tuple) -> None:
    import torch

    torch.set_num_threads(1)
    try:
        target(*args)
    except BaseException:
        (errors / f"error-{name}.txt").write_text(traceback.format_exc())
        raise


def start(target: Callable[..., None], args: tuple, errors: Path, name: str, env: dict[str, str] | None = None) -> Any:
    """Start `target(*args)` in a forked process (one torch thread); a traceback lands in errors/error-<name>.txt."""
    proc = context().Process(target=_with_env, args=(env or {}, target, errors, name, args), daemon=True)
    proc.start()
    return proc


def _with_env(env: dict[str, str], target: Callable[..., None], errors: Path, name: str, args: tuple) -> None:
    os.environ.update(env)
    _guarded(target, errors, name, args)


def join_all(procs: list[Any], timeout_s: float) -> None:
    """Wait for all; kill whatever is still running at the deadline (a rank left alone in a collective)."""
    deadline = time.monotonic() + timeout_s
    try:
        for p in procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()


def errors_of(errors: Path) -> str:
    return "\n".join(f.read_text() for f in sorted(errors.glob("error-*.txt")))
