"""Building the trainer's models without a whole float32 copy on every rank.

    policy     under FSDP2: built on the meta device, sharded, materialised empty, then filled from rank 0's
               read of the safetensors (a chunk of ~256 MB at a time, in the files' own dtype, cast as each
               rank's shard is copied in) by a broadcast. No rank holds the whole model: rank 0 holds its
               shards and one chunk. DDP and one rank:
               `from_pretrained` on each rank (DDP keeps a whole replica per rank by design).
    reference  the frozen KL model, in the compute dtype (bf16 under `trainer.mixed_precision=bf16`), sharded
               like the policy; not built at all when `algo.kl_coef` is 0.
    publishing `gathered_state_dict`: the whole weights on rank 0 in the published dtype, gathered one
               tensor at a time, so rank 0 never holds a float32 copy of a bf16 model.

What this is not: tensor or pipeline parallelism (one layer of a 70B model still fits one GPU under FSDP2).
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from agentrl.trainer.parallel import Parallel


def load_model(model_dir: str | Path, threads: int, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The whole model in one process (single-rank tools, tests, DDP ranks)."""
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)


def load_policy(model_dir: str | Path, threads: int, par: Parallel) -> torch.nn.Module:
    """The trainable model, wrapped for `par`'s layout, its master weights in float32."""
    if par.sharded:
        return _sharded(model_dir, threads, par, torch.float32, frozen=False)
    return par.wrap(load_model(model_dir, threads))


def load_reference(model_dir: str | Path, threads: int, par: Parallel,
                   state: dict[str, torch.Tensor] | None = None) -> torch.nn.Module:
    """The frozen KL reference in the compute dtype: `model_dir`'s weights, or `state` (whole weights, read on
    rank 0 only under FSDP2) when given."""
    dtype = par.dtype or torch.float32
    if par.sharded:
        return _sharded(model_dir, threads, par, dtype, frozen=True, state=state)
    ref = load_model(model_dir, threads, dtype)
    if state is not None:
        ref.load_state_dict({k: v.to(dtype) for k, v in state.items()})
    return par.wrap_frozen(ref)


def _sharded(model_dir: str | Path, threads: int, par: Parallel, dtype: torch.dtype, frozen: bool,
             state: dict[str, torch.Tensor] | None = None) -> torch.nn.Module:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.set_num_threads(threads)
    config = AutoConfig.from_pretrained(str(model_dir))
    with _parameters_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    buffers = {n: b.clone() for n, b in model.named_buffers()}  # rotary tables: computed, not in the files
    if frozen:
        model.requires_grad_(False).eval()
        par.wrap_frozen(model)
    else:
        par.wrap(model)
    model.to_empty(device=par.device)
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
    # Rank 0 reads the tensors a chunk at a time, in the files' (or the state's) own dtype, and each chunk is
    # broadcast into the ranks' shards (cast as it is copied in): rank 0 never holds a whole copy of the model.
    source = iter(state.items()) if state is not None else read_safetensors(model_dir) if par.is_main else iter(())
    more = True
    while more:
        chunk = _take(source, CHUNK_BYTES) if par.is_main else {}
        more = bool(par.broadcast_object(bool(chunk)))
        if more:
            set_model_state_dict(model, chunk, options=StateDictOptions(full_state_dict=True,
                                                                        broadcast_from_rank0=True, strict=False))
    return model


CHUNK_BYTES = 256 << 20


def _take(source: Iterator[tuple[str, torch.Tensor]], budget: int) -> dict[str, torch.Tensor]:
    """The next tensors of `source`, up to about `budget` bytes (at least one; empty when it is exhausted)."""
    out: dict[str, torch.Tensor] = {}
    size = 0
    for name, t in source:
        out[name] = t
        size += t.numel() * t.element_size()
        if size >= budget:
            break
    return out


def read_safetensors(model_dir: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a model directory's safetensors files (one file or an index of shards), one tensor at a
    time (the files are memory-mapped: nothing is read before it is asked for)."""
    from safetensors import safe_open

    d = Path(model_dir)
    index = d / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else \
        ["model.safetensors"]
    for name in files:
        with safe_open(str(d / name), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
                yield key, f.get_tensor(key)


def gathered_state_dict(model: torch.nn.Module, par: Parallel, dtype: torch.dtype | None = None
                        ) -> dict[str, torch.Tensor]:
    """The whole weights on CPU on rank 0 (an empty dict elsewhere), each tensor cast to `dtype` as soon as it
    is gathered. Collective under FSDP2 (every rank gathers each tensor in turn)."""
    if not par.sharded:
        sd = par.full_state_dict(model)
        return {k: v.to(dtype) if dtype is not None and v.is_floating_point() else v for k, v in sd.items()}
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        full = t.full_tensor() if hasattr(t, "full_tensor") else t
        if par.is_main:
            full = full.detach().to("cpu")
            out[name] = full.to(dtype) if dtype is not None and full.is_floating_point() else full.clone()
        del full
    return out


@contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device (one parameter is real at a time, while its
    module is constructed), their buffers on the CPU as usual."""
    register = torch.nn.Module.register_parameter

    def on_meta(self: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        register(self, name, param)
        if param is not None and not param.is_meta:  # one already on meta is kept as it is: ties stay ties
            self._parameters[name] = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]
