"""Building the trainer's models without a whole float32 copy on every rank, and gathering them back.

    policy     under FSDP2: built on the meta device, sharded, materialised empty, then each rank reads the
               rows of its own shard of each tensor from the safetensors files (plain reads, no memory map:
               `transport.tensor_file`), cast to float32 as they are copied in. No rank holds more than its
               shards plus one shard of one tensor. DDP and one rank: `from_pretrained` on each rank (DDP
               keeps a whole replica per rank by design).
    reference  the frozen KL model, in the compute dtype (bf16 under `trainer.mixed_precision=bf16`), sharded
               and read like the policy; not built at all when `algo.kl_coef` is 0.
    publishing `gather_tensors`: the whole tensors on the hub one at a time, each rank's shard cast to the
               published dtype before it is sent, for a writer that streams them to a file
               (`weights.stage_model_dir`); the hub holds one whole tensor beyond its shards, the others none.

What this is not: tensor or pipeline parallelism (one layer of a 70B model still fits one GPU under FSDP2).
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from agentrl.trainer import attention
from agentrl.trainer.parallel import Parallel
from agentrl.transport.tensor_file import Entry, read_header, read_rows


def set_threads(threads: int) -> None:
    """Torch's intra-op thread count, set through torch's own binding: once an in-process vLLM CPU engine has
    started, vLLM has replaced `torch.set_num_threads` with a no-op for the rest of the process, and a model
    loaded afterwards would silently compute on another count (other float reductions, other speed)."""
    torch._C.set_num_threads(threads)


def load_model(model_dir: str | Path, threads: int, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The whole model in one process (single-rank tools, tests, DDP ranks)."""
    from transformers import AutoModelForCausalLM

    set_threads(threads)
    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)


def load_policy(model_dir: str | Path, threads: int, par: Parallel, activation_checkpointing: bool = False,
                attn_implementation: str = "auto", freeze_layers: int = 0) -> torch.nn.Module:
    """The trainable model, wrapped for `par`'s layout, its master weights in float32; with
    `activation_checkpointing`, its decoder layers recompute their activations in the backward pass; its attention
    `attn_implementation` (`trainer.attention`); `freeze_layers` != 0: the embedding and the lower decoder layers
    are not trained (`freeze_lower`)."""
    if par.sharded:
        return _sharded(model_dir, threads, par, torch.float32, frozen=False,
                        activation_checkpointing=activation_checkpointing, attn_implementation=attn_implementation,
                        freeze_layers=freeze_layers)
    model = load_model(model_dir, threads)
    attention.apply(model, attn_implementation, par.device, par.dtype)
    if activation_checkpointing:
        checkpoint_activations(model)
    freeze_lower(model, freeze_layers)
    return par.wrap(model)


def freeze_lower(model: torch.nn.Module, n: int) -> None:
    """Leave the token embedding (and an output head tied to it) and the first `n` decoder layers out of training
    (`trainer.freeze_layers`): no gradient reaches below layer n, so the backward pass costs only the layers
    above it. `n` < 0: all but the top -n layers (none of them where the model has no more than -n). The forward
    pass, the published weights and the checkpoints are unchanged."""
    if n == 0:
        return
    layers = next((m for name, m in model.named_modules() if name.endswith(".layers")
                   and isinstance(m, torch.nn.ModuleList)), None)
    if layers is None or n >= len(layers):
        raise ValueError(f"trainer.freeze_layers: {n} must be below the model's decoder layers "
                         f"({'none found' if layers is None else len(layers)})")
    n = n if n > 0 else max(len(layers) + n, 0)
    model.get_input_embeddings().requires_grad_(False)
    for layer in layers[:n]:
        layer.requires_grad_(False)


def checkpoint_activations(model: torch.nn.Module) -> None:
    """Turn on Hugging Face's gradient checkpointing of the decoder layers (before wrapping: FSDP2 and DDP then
    wrap the checkpointed layers). Non-reentrant: it works with parameters that are DTensors and with inputs
    that need no gradient (the token ids)."""
    enable = getattr(model, "gradient_checkpointing_enable", None)
    if enable is None or not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"trainer.activation_checkpointing: {type(model).__name__} does not support Hugging "
                         "Face gradient checkpointing")
    enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def load_reference(model_dir: str | Path, threads: int, par: Parallel, weights: str | Path | None = None,
                   attn_implementation: str = "auto") -> torch.nn.Module:
    """The frozen KL reference in the compute dtype: `model_dir`'s weights, or those of the safetensors file
    `weights` (the warm-started policy, `checkpoint.save_reference`) when given."""
    dtype = par.dtype or torch.float32
    if par.sharded:
        return _sharded(model_dir, threads, par, dtype, frozen=True, weights=weights,
                        attn_implementation=attn_implementation)
    ref = load_model(model_dir, threads, dtype)
    attention.apply(ref, attn_implementation, par.device, par.dtype)
    if weights is not None:
        fill_from_files(ref, [Path(weights)])
    return par.wrap_frozen(ref)


def _sharded(model_dir: str | Path, threads: int, par: Parallel, dtype: torch.dtype, frozen: bool,
             weights: str | Path | None = None, activation_checkpointing: bool = False,
             attn_implementation: str = "auto", freeze_layers: int = 0) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    set_threads(threads)
    config = AutoConfig.from_pretrained(str(model_dir))
    with _parameters_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    attention.apply(model, attn_implementation, par.device, par.dtype)
    buffers = {n: b.clone() for n, b in model.named_buffers()}  # rotary tables: computed, not in the files
    if frozen:
        model.requires_grad_(False).eval()
        par.wrap_frozen(model)
    else:
        if activation_checkpointing:
            checkpoint_activations(model)
        freeze_lower(model, freeze_layers)
        par.wrap(model)
    model.to_empty(device=par.device)
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
    fill_from_files(model, [Path(weights)] if weights is not None else weight_files(model_dir))
    return model


def weight_files(model_dir: str | Path) -> list[Path]:
    """The safetensors files of a model directory (one file, or the shards its index names)."""
    d = Path(model_dir)
    index = d / "model.safetensors.index.json"
    if index.exists():
        return [d / n for n in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    return [d / "model.safetensors"]


def fill_from_files(model: torch.nn.Module, files: list[Path]) -> None:
    """Every parameter (and persistent buffer) of `model` read from `files` into its storage in place: under
    FSDP2 each rank reads only the rows of its own shard, so no rank holds more of the model than its shards
    plus one shard of one tensor (in the file's dtype, cast as it is copied in). Not collective.

    A tied parameter is filled from whichever of its names the files hold (`lm_head.weight` is usually left out
    of the files of a model with tied embeddings). A parameter the files lack is an error: an uninitialised
    tensor must never train or be published.
    """
    where: dict[str, tuple[Path, Entry]] = {}
    for path in files:
        where.update((name, (path, e)) for name, e in read_header(path).items())
    targets: dict[int, tuple[list[str], torch.Tensor]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        targets.setdefault(id(p), ([], p))[0].append(name)
    persistent = model.state_dict(keep_vars=True).keys()
    for name, b in model.named_buffers():
        if name in persistent:
            targets.setdefault(id(b), ([], b))[0].append(name)
    jobs: dict[Path, list[tuple[str, Entry, torch.Tensor]]] = {}
    for names, t in targets.values():
        found = next((n for n in names if n in where), None)
        if found is None:
            raise KeyError(f"{', '.join(names)}: in none of {[str(f) for f in files]}")
        path, entry = where[found]
        if tuple(entry.shape) != tuple(t.shape):
            raise ValueError(f"{found}: shape {tuple(entry.shape)} in {path}, {tuple(t.shape)} in the model")
        jobs.setdefault(path, []).append((found, entry, t))
    with torch.no_grad():
        for path, todo in jobs.items():
            with open(path, "rb") as f:
                for _, entry, t in sorted(todo, key=lambda j: j[1].start):  # in file order: sequential reads
                    local, first = _local_rows(t)
                    if local.numel() == 0:
                        continue
                    rows = read_rows(f, entry, first, local.shape[0]) if first is not None else read_rows(f, entry)
                    local.copy_(rows)
                    del rows


def _local_rows(t: torch.Tensor) -> tuple[torch.Tensor, int | None]:
    """(this rank's part of `t`, the index of its first row in the whole tensor), or (t, None) for a tensor
    every rank holds whole. FSDP2 shards dim 0 like `torch.chunk`: ceil(n / ranks) rows each, the last ones
    shorter or empty."""
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(t, DTensor):
        return t, None
    if len(t.placements) != 1 or t.placements[0] != Shard(0):
        raise ValueError(f"expected a DTensor sharded on dim 0 over one mesh dimension, got {t.placements}")
    local = t.to_local()
    n, ranks = t.shape[0], t.device_mesh.size()
    first = min(t.device_mesh.get_coordinate()[0] * -(-n // ranks), n)
    if local.shape[0] != max(0, min(-(-n // ranks), n - first)):
        raise ValueError(f"local shard of {local.shape[0]} rows is not torch.chunk's at row {first} of {n}")
    return local, first


def tensor_specs(model: torch.nn.Module, par: Parallel, dtype: torch.dtype | None = None
                 ) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
    """(name, dtype, whole shape) of every tensor of `model`'s state dict, in the order `gather_tensors` yields them:
    floating-point ones in `dtype` when given."""
    return [(name, dtype if dtype is not None and t.is_floating_point() else t.dtype, tuple(t.shape))
            for name, t in _unwrapped(model, par).state_dict().items()]


def _unwrapped(model: torch.nn.Module, par: Parallel) -> torch.nn.Module:
    """The model under DDP's wrapper (whose state dict names carry a `module.` prefix); FSDP2 wraps in place."""
    return model.module if par.distributed and not par.sharded and hasattr(model, "module") else model


def gather_tensors(model: torch.nn.Module, par: Parallel, dtype: torch.dtype | None = None
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """The whole tensors of `model`'s state dict on CPU, one at a time, yielded on the hub (nothing is yielded
    on the other ranks, which must still run the iterator to its end: it is collective under FSDP2).

    Each rank casts its own shard to `dtype` and sends it to the hub, which receives it into the whole tensor's
    rows: the hub holds one whole tensor (in `dtype`) beyond its shards, the others nothing beyond theirs. Tied
    names are yielded each (a separate gather and a separate tensor each, as safetensors wants).
    """
    import torch.distributed as dist

    for name, t in _unwrapped(model, par).state_dict().items():
        cast = dtype if dtype is not None and t.is_floating_point() else t.dtype
        local, first = _local_rows(t) if par.sharded else (t, None)
        if first is None:
            if par.is_main:
                yield name, local.detach().to("cpu", cast, copy=True)
            continue
        n, ranks = t.shape[0], t.device_mesh.size()
        chunk = -(-n // ranks)
        if not par.is_main:
            if local.numel():
                dist.send(local.detach().to(cast).contiguous(), dst=0)
            continue
        whole = torch.empty(tuple(t.shape), dtype=cast)
        whole[:local.shape[0]].copy_(local.detach())
        for r in range(1, ranks):
            lo, hi = min(r * chunk, n), min((r + 1) * chunk, n)
            if hi <= lo:
                continue
            if par.device.type == "cpu":
                dist.recv(whole[lo:hi], src=r)
            else:  # NCCL receives on the device
                buf = torch.empty((hi - lo, *t.shape[1:]), dtype=cast, device=par.device)
                dist.recv(buf, src=r)
                whole[lo:hi].copy_(buf)
                del buf
        yield name, whole
        del whole


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
