"""Packed attention over segments (`trainer.attention`): the varlen path (its exact CPU loop here) makes the naive
update on packed rows with grouped-query heads; torch's kernel is called causal and with its GQA convention on each
torch; the flex block mask's blocks hold exactly the allowed pairs; the choice resolves and refuses as documented."""
from __future__ import annotations

import copy

import naive_rl
import pytest
import torch
from test_head import TIGHT, _batch, _model

from agentrl.config import AlgoConfig, TrainerConfig
from agentrl.trainer import attention
from agentrl.trainer.batch import layout, plan_micro_batches
from agentrl.trainer.logprobs import full_vocab_logprobs, head_outputs
from agentrl.trainer.step import rl_step


def test_varlen_packed_update_equals_the_naive_update() -> None:
    model, batch = _model(tied=False), _batch(2)  # 4 query heads over 2 KV heads
    algo, trainer = AlgoConfig(entropy_coef=0.05), TrainerConfig(grad_clip=0.0, packing=True, micro_batch_tokens=40)
    expected = naive_rl.update(model, naive_rl.rl_loss(model, batch, algo, 0.8)[0])
    m = copy.deepcopy(model)
    assert attention.apply(m, "varlen", torch.device("cpu")) == "varlen" == attention.implementation(m)
    # a plain call (no segments) falls back to SDPA with the model's own mask: evaluation code keeps working
    with torch.no_grad():
        logits = m(input_ids=batch.tokens, attention_mask=batch.attention).logits
        torch.testing.assert_close(logits, model(input_ids=batch.tokens, attention_mask=batch.attention).logits,
                                   **TIGHT)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    rl_step(m, torch.optim.SGD(m.parameters(), lr=1.0), batch, algo, trainer, 0.8)
    scale = max(float(v.abs().max()) for v in expected.values())
    for k, v in m.state_dict().items():
        torch.testing.assert_close(v - before[k], expected[k], rtol=1e-6, atol=1e-6 * scale, msg=k)


def _segments(lengths: list[list[int]], L: int) -> torch.Tensor:
    segs = [s for row in lengths for s in [*row, L - sum(row)] if s > 0]
    return torch.cumsum(torch.tensor([0, *segs]), 0).to(torch.int32)


def _allowed(cu: torch.Tensor, R: int, L: int) -> torch.Tensor:  # [R, L, L] the element mask, naively
    doc = attention.segment_ids(cu, R, L)
    causal = torch.arange(L)[:, None] >= torch.arange(L)[None, :]
    return (doc[:, :, None] == doc[:, None, :]) & causal


@pytest.mark.parametrize("lengths, L", [([[300, 5, 100], [405]], 405), ([[1], [128, 128, 1]], 300), ([[700]], 700)])
def test_flex_blocks_hold_exactly_the_allowed_pairs(lengths: list[list[int]], L: int) -> None:
    cu, B = _segments(lengths, L), attention.BLOCK
    partial, full = attention.block_structure(cu, len(lengths), L)
    allowed = _allowed(cu, len(lengths), L)
    n = -(-L // B)
    for r in range(len(lengths)):
        for qb in range(n):
            for kb in range(n):
                tile = allowed[r, qb * B:(qb + 1) * B, kb * B:(kb + 1) * B]
                if full[r, qb, kb]:
                    assert tile.all() and not partial[r, qb, kb]
                elif partial[r, qb, kb]:
                    assert tile.any()
                else:
                    assert not tile.any(), (r, qb, kb)
    assert full.any() or L <= B


SEEN: dict = {}


def _kernel(q, k, v, cu, scale, causal: bool, gqa: bool):
    """What each fake checks: causal, and KV heads equal to query heads unless the kernel takes enable_gqa."""
    SEEN.update(causal=causal, heads=(q.shape[1], k.shape[1]), scale=scale)
    assert causal and (gqa or k.shape[1] == q.shape[1])
    return attention.segment_loop_attention(q, k, v, cu, scale)


def varlen_210(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, is_causal=False):
    return _kernel(q, k, v, cu_q, scale, is_causal, False)


def varlen_211(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1)):
    return _kernel(q, k, v, cu_q, scale, tuple(window_size) == (-1, 0), False)


def varlen_213(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), enable_gqa=False):
    return _kernel(q, k, v, cu_q, scale, tuple(window_size) == (-1, 0), enable_gqa)


@pytest.mark.parametrize("fake, repeated", [(varlen_210, True), (varlen_211, True), (varlen_213, False)])
def test_torch_varlen_is_called_causal_with_its_gqa_convention(fake, repeated: bool) -> None:
    """torch 2.10 takes is_causal, 2.11 a window and no enable_gqa (KV heads repeated), 2.13 both."""
    q, k = torch.randn(9, 4, 8), torch.randn(9, 2, 8)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    out = attention.call_torch_varlen(fake, q, k, k, cu, 5, 0.3)
    torch.testing.assert_close(out, attention.segment_loop_attention(q, k, k, cu, 0.3))
    assert SEEN == {"causal": True, "heads": (4, 4) if repeated else (4, 2), "scale": 0.3}


def test_the_choice_resolves_per_device_and_refuses_what_cannot_run() -> None:
    from types import SimpleNamespace

    cfg, sliding = SimpleNamespace(layer_types=["full_attention"]), SimpleNamespace(layer_types=["sliding_attention"])
    cpu = torch.device("cpu")
    assert attention.resolve("auto", cpu, cfg) == "sdpa"
    assert attention.resolve("varlen", cpu, cfg) == "varlen"
    with pytest.raises(ValueError, match="CUDA only"):
        attention.resolve("flex", cpu, cfg)
    with pytest.raises(ValueError, match="sliding"):
        attention.resolve("varlen", cpu, sliding)
    with pytest.raises(ValueError, match="one of"):
        attention.resolve("flash", cpu, cfg)
    cuda = torch.device("cuda")
    if attention.torch_varlen() is not None:
        assert attention.resolve("auto", cuda, cfg) == "varlen"
    assert attention.resolve("auto", cuda, sliding) == attention.resolve("auto", cuda, cfg, None) == "sdpa"
    with pytest.raises(ValueError, match="bf16 or fp16"):
        attention.resolve("varlen", cuda, cfg, None)


@pytest.mark.slow
def test_flex_forward_on_packed_rows_equals_the_padded_log_probs() -> None:
    """flex_attention compiled on the CPU (forward only: torch has no CPU backward), ~30 s of compilation."""
    model, batch = _model(tied=True).float(), _batch(3)
    attention._register()
    m = copy.deepcopy(model)
    m.set_attn_implementation(attention.HF_NAMES["flex"])
    with torch.no_grad():
        padded, _ = full_vocab_logprobs(model, batch.tokens, batch.attention)
        mb = layout(batch, plan_micro_batches(batch.lengths, 10_000, True)[0], {"logp": padded, "mask": batch.mask},
                    True)
        logp, _, _ = head_outputs(m, mb)
    on = mb.targets["mask"] > 0
    torch.testing.assert_close(mb.grid(logp)[on], mb.targets["logp"][on], rtol=0, atol=2e-5)
