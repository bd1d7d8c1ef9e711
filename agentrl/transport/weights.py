"""Versioned weight directories: how the trainer publishes weights and rollout engines find them.

    run_dir/weights/v<N>/model.safetensors   (+ meta.json; the directory appears atomically by rename)

This works within one job and between separate jobs on a shared filesystem. An in-job broadcast path
(NCCL/MPI) can sit beside it later; the version numbering is the same.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from agentrl.transport.fsio import fsync_dir

WEIGHTS_FILE = "model.safetensors"


def version_dir(run_dir: str | Path, version: int) -> Path:
    return Path(run_dir) / "weights" / f"v{version}"


def publish(run_dir: str | Path, version: int, state_dict: dict[str, torch.Tensor], keep_last: int = 3,
            meta: dict[str, object] | None = None) -> Path:
    """Write weights v<version> (tied tensors written as separate copies); older versions beyond `keep_last` go."""
    final = version_dir(run_dir, version)
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    seen: set[int] = set()
    tensors = {}
    for name, t in state_dict.items():
        t = t.detach().to("cpu")
        # Tied weights (lm_head = embed_tokens) are written twice, as separate copies: safetensors refuses
        # shared storage, and vLLM's CPU backend keeps its own processed copy of lm_head, so a reload
        # without it would leave the engine sampling from the old head.
        tensors[name] = t.clone() if t.data_ptr() in seen else t.contiguous()
        seen.add(t.data_ptr())
    try:
        save_file(tensors, str(tmp / WEIGHTS_FILE))
        (tmp / "meta.json").write_text(json.dumps({"version": version, "time": time.time(), **(meta or {})}))
        with open(tmp / WEIGHTS_FILE, "rb") as f:
            os.fsync(f.fileno())
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    aside = None
    if final.exists():  # a restarted trainer writing a version again: swap by two renames, never a delete first
        aside = final.with_name(f".old-{final.name}-{os.getpid()}")
        os.replace(final, aside)
    os.replace(tmp, final)
    fsync_dir(final.parent)  # the rename itself is durable before anyone is told of v<version>
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
    for old in sorted(final.parent.glob("v*"), key=lambda p: int(p.name[1:]))[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_version(run_dir: str | Path) -> int:
    d = Path(run_dir) / "weights"
    versions = [int(p.name[1:]) for p in d.glob("v*") if p.name[1:].isdigit()] if d.exists() else []
    return max(versions, default=-1)


def discard_newer(run_dir: str | Path, version: int) -> list[int]:
    """Remove weights newer than `version` (a trainer resuming from an older checkpoint: those versions'
    lineage is gone, and no engine may load them again). Returns the versions removed."""
    d = Path(run_dir) / "weights"
    gone = sorted(int(p.name[1:]) for p in d.glob("v*") if p.name[1:].isdigit() and int(p.name[1:]) > version) \
        if d.exists() else []
    for v in gone:
        aside = d / f".discard-v{v}-{os.getpid()}"
        os.replace(version_dir(run_dir, v), aside)  # gone from `latest_version` at once, then deleted
        shutil.rmtree(aside, ignore_errors=True)
    if gone:
        fsync_dir(d)
    return gone


def wait_for(run_dir: str | Path, version: int, timeout_s: float, poll_s: float = 0.05) -> Path:
    path = version_dir(run_dir, version)
    deadline = time.monotonic() + timeout_s
    while not (path / WEIGHTS_FILE).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"weights v{version} did not appear at {path} within {timeout_s:.0f}s")
        time.sleep(poll_s)
    return path


def iter_weights(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    yield from load_file(str(Path(path) / WEIGHTS_FILE)).items()
