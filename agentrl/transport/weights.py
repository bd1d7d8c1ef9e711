"""Versioned weight directories: how the trainer publishes weights and rollout engines find them.

    run_dir/weights/v<N>/model.safetensors   the weights, in the model's own dtype (config.json's)
                         config.json, generation_config.json, tokenizer files, chat template
                         meta.json               version, time (agentrl's own; other tools ignore it)

Each version is a complete Hugging Face model directory: `AutoModelForCausalLM.from_pretrained`,
`vllm.LLM(model=...)` and vLLM's OpenAI server load it as it is, so any published version can be served
or evaluated by tools that know nothing of agentrl. The directory appears atomically by rename. This
works within one job and between separate jobs on a shared filesystem; the in-job broadcast path
(`transport/broadcast.py`) uses the same version numbers.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from agentrl.fsio import fsync_dir
from agentrl.transport.tensor_file import write_tensors

WEIGHTS_FILE = "model.safetensors"
# Files of a model directory that are weights (never copied from the base: the published ones replace them).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def model_dtype(base: str | Path) -> torch.dtype | None:
    """The dtype the model directory `base` declares in config.json (`dtype`, or `torch_dtype` before
    transformers 5); None when it declares none."""
    cfg = Path(base) / "config.json"
    if not cfg.exists():
        return None
    data = json.loads(cfg.read_text())
    name = data.get("dtype") or data.get("torch_dtype")
    return getattr(torch, name) if isinstance(name, str) and isinstance(getattr(torch, name, None), torch.dtype) \
        else None


def copy_model_files(base: str | Path, out: str | Path, chat_template: str | None = None) -> list[str]:
    """Copy every file of model directory `base` but its weights (config, generation config, tokenizer,
    chat template, ...) into `out`; returns the names copied. `chat_template` (the run's `model.chat_template`,
    as text) replaces the base's own template (`write_chat_template`)."""
    names = []
    for f in sorted(Path(base).iterdir()):
        if f.is_file() and not f.name.endswith(_WEIGHT_SUFFIXES) and f.name not in _WEIGHT_INDEXES \
                and f.name != "meta.json" and not f.name.startswith("."):
            shutil.copy2(f, Path(out) / f.name)
            names.append(f.name)
    if chat_template is not None:
        write_chat_template(out, chat_template)
    return names


def write_chat_template(model_dir: str | Path, template: str) -> None:
    """Make `template` the chat template of the model directory (transformers' and vLLM's tokenizers read it
    from chat_template.jinja): the directory's other copies (tokenizer_config.json's `chat_template`, a
    chat_template.json) are removed, so that no reader can take the old one."""
    d = Path(model_dir)
    (d / "chat_template.jinja").write_text(template)
    (d / "chat_template.json").unlink(missing_ok=True)
    tc = d / "tokenizer_config.json"
    if tc.exists():
        data = json.loads(tc.read_text())
        if data.pop("chat_template", None) is not None:
            tc.write_text(json.dumps(data, indent=2, ensure_ascii=False))


def version_dir(run_dir: str | Path, version: int) -> Path:
    return Path(run_dir) / "weights" / f"v{version}"


def publish(run_dir: str | Path, version: int, state_dict: dict[str, torch.Tensor], keep_last: int = 3,
            meta: dict[str, object] | None = None, base: str | Path | None = None,
            chat_template: str | None = None) -> Path:
    """Write weights v<version> (`save_model_dir`); older versions beyond `keep_last` go."""
    final = save_model_dir(version_dir(run_dir, version), state_dict, base, {"version": version, **(meta or {})},
                           chat_template)
    _prune(final.parent, keep_last)
    return final


@dataclass(frozen=True)
class Staged:
    """A model directory written but not yet in place (`stage_model_dir`): `commit` renames it to `final`."""

    tmp: Path
    final: Path


def stage_model_dir(final: str | Path, specs: Sequence[tuple[str, torch.dtype, Sequence[int]]],
                    tensors: Iterable[tuple[str, torch.Tensor]], base: str | Path | None = None,
                    meta: dict[str, object] | None = None, chat_template: str | None = None) -> Staged:
    """Write the model directory of `final` under a temporary name, streaming `tensors` (name, tensor; one at a
    time, in the order of `specs`: name, dtype, whole shape) into its safetensors file as they come, so the
    writer never holds more than the tensor at hand. `base`: as for `save_model_dir`, whose dtype the
    floating-point tensors are cast to (specs included); `chat_template`: as for `copy_model_files`. Nothing is
    fsynced yet: `commit` does it.

    Tied weights (lm_head = embed_tokens) are written once per name: vLLM's CPU backend keeps its own processed
    copy of lm_head, so a reload without it would leave the engine sampling from the old head.
    """
    final = Path(final)
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    dtype = model_dtype(base) if base is not None else None

    def cast(dt: torch.dtype) -> torch.dtype:
        return dtype if dtype is not None and dt.is_floating_point else dt

    try:
        if base is not None:
            copy_model_files(base, tmp, chat_template)
        write_tensors(tmp / WEIGHTS_FILE, [(n, cast(dt), shape) for n, dt, shape in specs],
                      ((n, t.to(cast(t.dtype))) for n, t in tensors), metadata={"format": "pt"}, fsync=False)
        (tmp / "meta.json").write_text(json.dumps({"time": time.time(), **(meta or {})}))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Staged(tmp, final)


def commit(staged: Staged) -> Path:
    """Make a staged directory durable and put it in place by rename (the directory appears whole)."""
    tmp, final = staged.tmp, staged.final
    for name in (WEIGHTS_FILE, "meta.json"):
        with open(tmp / name, "rb") as f:
            os.fsync(f.fileno())
    fsync_dir(tmp)
    aside = None
    if final.exists():  # a restarted trainer writing a version again: swap by two renames, never a delete first
        aside = final.with_name(f".old-{final.name}-{os.getpid()}")
        os.replace(final, aside)
    os.replace(tmp, final)
    fsync_dir(final.parent)  # the rename itself is durable before anyone is told of v<version>
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
    return final


def publish_staged(staged: Staged, keep_last: int = 3) -> Path:
    """Put weights v<N> staged by `stage_model_dir` in place; older versions beyond `keep_last` go."""
    final = commit(staged)
    _prune(final.parent, keep_last)
    return final


def _prune(weights_dir: Path, keep_last: int) -> None:
    for old in sorted(weights_dir.glob("v*"), key=lambda p: int(p.name[1:]))[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def save_model_dir(final: str | Path, state_dict: dict[str, torch.Tensor], base: str | Path | None = None,
                   meta: dict[str, object] | None = None, chat_template: str | None = None) -> Path:
    """Write `state_dict` as the model directory `final`, which appears whole by rename (tied tensors are
    written as separate copies).

    `base`: the model directory the run started from. Its non-weight files are copied beside the weights
    and floating-point tensors are cast to its declared dtype, so the result is a complete model directory
    in the model's dtype (a bf16 model is published in bf16 whatever precision the trainer holds);
    `chat_template`, the run's own template (`model.chat_template`), replaces the base's."""
    specs = [(n, t.dtype, tuple(t.shape)) for n, t in state_dict.items()]
    return commit(stage_model_dir(final, specs, state_dict.items(), base, meta, chat_template))


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
