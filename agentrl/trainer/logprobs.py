"""Per-token log-probs (and entropy, argmax hits) of a causal LM at chosen positions, without vocabulary-sized tensors.

`head_outputs` runs the decoder on a micro-batch and the language-model head only on the positions the step trains
or measures (`MicroBatch.select`), through `trainer.head`'s tiled head. It runs *inside* the model's own forward
call: for that call the Hugging Face model's `forward` is this module's `_lean_forward`, so DDP's forward (gradient
synchronisation) and FSDP2's root hooks (the head's weight unsharded while the fused head runs, and again for its
backward) wrap it exactly as they wrap the model's usual forward. Tied heads need nothing special: the head's weight
is the embedding matrix, one parameter.

`token_logprobs` is the same for every position of a plain [B, T] batch (evaluation, tests). `full_vocab_logprobs`
keeps the old whole-vocabulary path as a reference for tests and benchmarks.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from types import MethodType
from typing import Any

import torch
from torch import Tensor

from agentrl.trainer import attention as attn
from agentrl.trainer.batch import MicroBatch
from agentrl.trainer.head import EntropyMode, head_logprobs

log = logging.getLogger("agentrl.trainer")

# Configuration fields of heads that do more than a linear map (soft-capping, scaling): the tiled head would
# silently compute other log-probs than the model's own forward, so such models are refused.
_NOT_LINEAR_HEADS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def _inner(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)  # DDP keeps the model as .module; FSDP2 wraps in place


def check_linear_head(model: torch.nn.Module) -> None:
    """Refuse a model whose logits are not its head's plain linear map of the final hidden state."""
    inner = _inner(model)
    bad = [f for f in _NOT_LINEAR_HEADS if getattr(inner.config, f, None) not in (None, 1, 1.0)]
    if bad or not isinstance(inner.get_output_embeddings(), torch.nn.Linear):
        raise ValueError(f"{type(inner).__name__}: the trainer's tiled head needs logits = lm_head(hidden); this "
                         f"model's head differs ({', '.join(bad) or type(inner.get_output_embeddings()).__name__})")


def _lean_forward(self: torch.nn.Module, select: Tensor, next_tokens: Tensor, temperature: float,
                  entropy: EntropyMode, **decoder_kwargs: Any) -> tuple[Tensor, Tensor, Tensor]:
    """Stands in for the model's `forward` during one call: decoder, then the tiled head at `select` [N]."""
    decoder = getattr(self, self.base_model_prefix)
    hidden = decoder(use_cache=False, **decoder_kwargs).last_hidden_state  # [R, L, D]
    picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, select)  # [N, D]
    head = self.get_output_embeddings()
    return head_logprobs(picked, head.weight, head.bias, next_tokens, temperature, entropy)


@contextmanager
def _forward_is_lean(model: torch.nn.Module) -> Iterator[None]:
    inner = _inner(model)
    inner.forward = MethodType(_lean_forward, inner)  # an instance attribute shadows the class's forward
    try:
        yield
    finally:
        del inner.forward


def run_head(model: torch.nn.Module, tokens: Tensor, select: Tensor, next_tokens: Tensor, temperature: float,
             entropy: EntropyMode, decoder_kwargs: dict[str, Any]) -> tuple[Tensor, Tensor, Tensor]:
    """(logp [N], entropy [N], top [N]) at the flat positions `select` [N] of `tokens` [R, L], through the model's
    own forward call (so DDP and FSDP2 see an ordinary forward)."""
    check_linear_head(model)
    with _forward_is_lean(model):
        return model(input_ids=tokens, select=select, next_tokens=next_tokens, temperature=temperature,
                     entropy=entropy, **decoder_kwargs)


def head_outputs(model: torch.nn.Module, mb: MicroBatch, temperature: float = 1.0, entropy: EntropyMode = "value"
                 ) -> tuple[Tensor, Tensor, Tensor]:
    """(logp [N], entropy [N], top [N]) at a micro-batch's selected positions, with the model's attention
    implementation fed the micro-batch's segments."""
    kwargs = attn.decoder_inputs(attn.implementation(model), tuple(mb.tokens.shape), mb.attention, mb.position_ids,
                                 mb.cu_seqlens, mb.max_seqlen)
    return run_head(model, mb.tokens, mb.select, mb.next_tokens, temperature, entropy, kwargs)


def token_logprobs(model: torch.nn.Module, tokens: Tensor, attention: Tensor | None, temperature: float = 1.0,
                   position_ids: Tensor | None = None, entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """Log-prob of tokens[:, 1:] under the model, logits divided by `temperature` (as the sampler did).

    Args:
        tokens: [B, T] token ids.
        attention: [B, T] 1 on real tokens (right padding), or None for a packed batch.
        temperature: the sampler's temperature (0 or 1: logits as they are).
        position_ids: [B, T] positions restarting at 0 for each packed sequence (with `attention` None).
        entropy: also return each position's entropy.

    Returns:
        (logp [B, T-1], entropy [B, T-1] or None). Differentiable in logp; no [B, T, V] tensor is made.
    """
    B, T = tokens.shape
    cols = torch.arange(T - 1, device=tokens.device)
    select = (torch.arange(B, device=tokens.device)[:, None] * T + cols).reshape(-1)  # [B·(T-1)]
    kwargs = {"attention_mask": attention, "position_ids": position_ids}  # the model's own masks (any attention)
    logp, ent, _ = run_head(model, tokens, select, tokens[:, 1:].reshape(-1), temperature,
                            "value" if entropy else "none", kwargs)
    return logp.view(B, T - 1), ent.view(B, T - 1) if entropy else None


def full_vocab_logprobs(model: torch.nn.Module, tokens: Tensor, attention: Tensor | None, temperature: float = 1.0,
                        position_ids: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The old path, kept as the baseline of tests and `jobs.bench_trainer_memory`: (logp [B, T-1], the whole
    float32 log-softmax [B, T-1, V])."""
    out = model(input_ids=tokens, attention_mask=attention, position_ids=position_ids, use_cache=False)
    logits = out.logits[:, :-1]
    logits = logits.double() if logits.dtype == torch.float64 else logits.float()  # [B, T-1, V]
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    log_probs = torch.log_softmax(logits, dim=-1)  # [B, T-1, V]
    return log_probs.gather(-1, tokens[:, 1:, None]).squeeze(-1), log_probs


def entropy_from_log_probs(log_probs: Tensor) -> Tensor:  # [..., V] -> [...]
    """Entropy in nats of distributions given as log-probs (a log-softmax); 0·log 0 counts as 0."""
    lp = log_probs.clamp_min(torch.finfo(log_probs.dtype).min)  # −inf → the most negative float: 0 · it = 0
    return -torch.linalg.vecdot(lp.exp(), lp)
