"""Attention over packed rows that costs Σ sᵢ² (each trajectory attends within itself), not L² per row.

`trainer.attn_implementation` picks one (`resolve`), logged at load:

    sdpa    Hugging Face's SDPA path as it was: packed rows get a materialised block-diagonal causal mask built from
            the restarting position ids, and the kernel computes the whole row's L² scores. The CPU default.
    varlen  torch's `torch.nn.attention.varlen.varlen_attn` (FlashAttention inside torch, CUDA only) over the
            flattened micro-batch, with the segments' cumulative lengths made once per micro-batch on the host
            (`MicroBatch.cu_seqlens`): no mask, no host sync. KV heads are repeated where the kernel has no
            `enable_gqa` (torch 2.11). On a CPU the same plumbing runs an exact loop of SDPA calls, one per segment
            (tests; slow rows). The default on CUDA in bf16 (FlashAttention has no float32).
    flex    `flex_attention` (compiled once, dynamic shapes) with a block mask made by arithmetic from the segment
            boundaries: only the blocks on the diagonal bands are computed. CUDA only for training (torch has no
            flex backward on CPU).

The choice becomes the model's `config._attn_implementation` (our functions are registered with Hugging Face's
`AttentionInterface` under `agentrl_varlen` / `agentrl_flex`), so checkpointed layers recompute with the same one.
Called without our per-micro-batch inputs (a plain `model(input_ids, attention_mask)` from evaluation code), both
fall back to SDPA with Hugging Face's own mask: the model stays usable everywhere.
"""
from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from functools import cache
from typing import Any

import torch
from torch import Tensor

ATTN_IMPLEMENTATIONS = ("auto", "sdpa", "flex", "varlen")
HF_NAMES = {"sdpa": "sdpa", "varlen": "agentrl_varlen", "flex": "agentrl_flex"}
BLOCK = 128  # flex_attention's sparse block size

log = logging.getLogger("agentrl.trainer")


@cache
def torch_varlen() -> Callable[..., Tensor] | None:
    """torch's varlen_attn, or None where this torch lacks it."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def _sliding(config: Any) -> bool:
    return "sliding_attention" in (getattr(config, "layer_types", None) or ())


def resolve(choice: str, device: torch.device, config: Any, dtype: torch.dtype | None = torch.bfloat16) -> str:
    """The implementation `choice` means on `device` for a model of `config` computing in `dtype` (None: float32):
    sdpa | varlen | flex."""
    if choice not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"trainer.attn_implementation must be one of {ATTN_IMPLEMENTATIONS}, got {choice!r}")
    half = dtype in (torch.bfloat16, torch.float16)  # FlashAttention's dtypes
    if choice == "auto":
        ok = device.type == "cuda" and torch_varlen() is not None and half and not _sliding(config)
        return "varlen" if ok else "sdpa"
    if choice != "sdpa" and _sliding(config):
        raise ValueError(f"trainer.attn_implementation={choice}: the model has sliding-window layers; use sdpa")
    if choice == "varlen" and device.type == "cuda" and not half:
        raise ValueError("trainer.attn_implementation=varlen on CUDA computes in bf16 or fp16 only "
                         "(trainer.mixed_precision=fp32 asks for float32): use sdpa")
    if choice == "flex" and device.type != "cuda":
        raise ValueError("trainer.attn_implementation=flex trains on CUDA only (torch has no flex backward on CPU)")
    return choice


def apply(model: torch.nn.Module, choice: str, device: torch.device, dtype: torch.dtype | None = torch.bfloat16
          ) -> str:
    """Set `model`'s attention to `choice` (resolved for `device` and the compute `dtype`) before it is wrapped;
    returns and logs it."""
    impl = resolve(choice, device, model.config, dtype)
    if impl != "sdpa":
        _register()
    model.set_attn_implementation(HF_NAMES[impl])
    log.info("attention: %s (trainer.attn_implementation=%s, %s)", impl, choice, device.type)
    return impl


def implementation(model: torch.nn.Module) -> str:
    """Which of ours a (possibly wrapped) model runs: sdpa | varlen | flex."""
    inner = getattr(model, "module", model)
    name = getattr(inner.config, "_attn_implementation", "sdpa")
    return {v: k for k, v in HF_NAMES.items()}.get(name, "sdpa")


# ------------------------------------------------------------------------------------------------ per micro-batch

def decoder_inputs(impl: str, shape: tuple[int, int], attention: Tensor | None, position_ids: Tensor | None,
                   cu_seqlens: Tensor, max_seqlen: int) -> dict[str, Any]:
    """Keyword arguments of the decoder call for a micro-batch of `shape` [R, L] whose segments (trajectories, and
    each row's padding tail) have cumulative lengths `cu_seqlens` [S+1] int32 over the flattened R·L tokens."""
    if impl == "sdpa":
        return {"attention_mask": attention, "position_ids": position_ids}
    R, L = shape
    if impl == "varlen":
        # a 4-D mask is passed through Hugging Face's mask builders untouched; all-False, so that any path that read
        # it instead of the segments would fail loudly (NaN), never attend across trajectories
        never = torch.zeros((), dtype=torch.bool, device=cu_seqlens.device).expand(R, 1, L, L)
        return {"attention_mask": never, "position_ids": position_ids, "cu_seq_lens_q": cu_seqlens,
                "cu_seq_lens_k": cu_seqlens, "max_length_q": max_seqlen, "max_length_k": max_seqlen}
    return {"attention_mask": block_mask(cu_seqlens, R, L), "position_ids": position_ids}


def segment_ids(cu_seqlens: Tensor, R: int, L: int) -> Tensor:  # [S+1] → [R, L]: the segment of every token
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    return torch.repeat_interleave(torch.arange(lengths.numel(), device=cu_seqlens.device), lengths,
                                   output_size=R * L).view(R, L)


def block_structure(cu_seqlens: Tensor, R: int, L: int, block: int = BLOCK) -> tuple[Tensor, Tensor]:
    """(partial [R, nQ, nK], full [R, nQ, nK]) bool: which (query block, key block) pairs hold some allowed pair and
    which hold only allowed pairs, for causal attention within segments. Pure arithmetic on the boundaries."""
    doc = segment_ids(cu_seqlens, R, L)  # [R, L]
    row0 = torch.arange(R, device=doc.device)[:, None] * L
    start = cu_seqlens[doc].long() - row0  # [R, L] the first position of each token's segment, within its row
    n = -(-L // block)
    qb = torch.arange(n, device=doc.device)
    first, last = start[:, qb * block], start[:, (qb * block + block - 1).clamp(max=L - 1)]  # [R, nQ]
    kb = qb[None, None, :]  # [1, 1, nK]
    some = (kb >= (first // block)[..., None]) & (kb <= qb[None, :, None])
    full = (kb < qb[None, :, None]) & (last[..., None] <= kb * block)
    return some & ~full, full


def block_mask(cu_seqlens: Tensor, R: int, L: int) -> Any:
    """flex_attention's BlockMask for causal attention within the segments of `cu_seqlens`."""
    from torch.nn.attention.flex_attention import BlockMask

    doc = segment_ids(cu_seqlens, R, L)
    partial, full = block_structure(cu_seqlens, R, L)

    def mask_mod(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return (doc[b, q] == doc[b, kv]) & (q >= kv)

    def blocks(m: Tensor) -> tuple[Tensor, Tensor]:  # [R, nQ, nK] bool → counts [R, 1, nQ], indices [R, 1, nQ, nK]
        order = torch.argsort((~m).to(torch.int8), dim=-1, stable=True)
        return m.sum(-1, dtype=torch.int32)[:, None], order.to(torch.int32)[:, None]

    return BlockMask.from_kv_blocks(*blocks(partial), *blocks(full), BLOCK_SIZE=BLOCK, mask_mod=mask_mod,
                                    seq_lengths=(L, L))


# ------------------------------------------------------------------------------------------------ kernels

def segment_loop_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, scale: float | None) -> Tensor:
    """Causal attention within each segment, one SDPA call per segment (the exact CPU stand-in of varlen_attn).
    q [T, H, d], k, v [T, Hkv, d] → [T, H, d]."""
    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    gqa = k.shape[1] != q.shape[1]
    for a, b in zip(bounds[:-1], bounds[1:]):
        qs, ks, vs = (x[None, a:b].transpose(1, 2) for x in (q, k, v))  # [1, H, s, d]: 4-D for the fused kernels
        o = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=gqa)
        out[a:b] = o[0].transpose(0, 1)
    return out


def varlen_kernel(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int,
                  scale: float | None) -> Tensor:
    """Causal attention within the segments of the flattened tokens: torch's varlen_attn on CUDA, the segment loop
    elsewhere. q [T, H, d], k, v [T, Hkv, d] → [T, H, d]."""
    fn = torch_varlen()
    if not q.is_cuda or fn is None:
        return segment_loop_attention(q, k, v, cu_seqlens, scale)
    return call_torch_varlen(fn, q, k, v, cu_seqlens, max_seqlen, scale)


def call_torch_varlen(fn: Callable[..., Tensor], q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor,
                      max_seqlen: int, scale: float | None) -> Tensor:
    """`fn` (torch's varlen_attn) causal over the segments, whichever torch: a `window_size` of (-1, 0) (2.11 on)
    or `is_causal` (2.10); KV heads repeated where it has no `enable_gqa` (2.11)."""
    params = inspect.signature(fn).parameters
    kwargs: dict[str, Any] = {"scale": scale}
    kwargs.update({"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True})
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return fn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, **kwargs)


def _sdpa(module: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Any, **kwargs: Any
          ) -> tuple[Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    for k in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"):
        kwargs.pop(k, None)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def varlen_attention(module: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Any,
                     scaling: float | None = None, dropout: float = 0.0, **kwargs: Any) -> tuple[Tensor, None]:
    """Hugging Face attention function: query [B, H, L, d], key/value [B, Hkv, L, d] → ([B, L, H, d], None)."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        return _sdpa(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    if dropout:
        raise ValueError("varlen attention: attention dropout is not supported")
    B, H, L, d = query.shape
    q = query.transpose(1, 2).reshape(B * L, H, d)
    k = key.transpose(1, 2).reshape(B * L, key.shape[1], d)
    v = value.transpose(1, 2).reshape(B * L, value.shape[1], d)
    out = varlen_kernel(q, k, v, cu, int(kwargs["max_length_q"]), scaling)
    return out.view(B, L, H, d), None


@cache
def _compiled_flex() -> Callable[..., Tensor]:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=None)  # automatic dynamic shapes: row widths change every step


def flex_attention(module: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Any,
                   scaling: float | None = None, dropout: float = 0.0, **kwargs: Any) -> tuple[Tensor, None]:
    """Hugging Face attention function over a BlockMask (`block_mask`); SDPA for any other mask."""
    from torch.nn.attention.flex_attention import BlockMask

    if not isinstance(attention_mask, BlockMask):
        return _sdpa(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    out = _compiled_flex()(query, key, value, block_mask=attention_mask, scale=scaling,
                           enable_gqa=key.shape[1] != query.shape[1])  # [B, H, L, d]
    return out.transpose(1, 2), None


@cache
def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(HF_NAMES["varlen"], varlen_attention)
    AttentionInterface.register(HF_NAMES["flex"], flex_attention)
    for name in (HF_NAMES["varlen"], HF_NAMES["flex"]):  # plain calls build SDPA's mask, as the fallback reads it
        AttentionMaskInterface.register(name, sdpa_mask)
