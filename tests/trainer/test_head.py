"""The tiled language-model head (`trainer.head`) and the lean step built on it equal the whole-vocabulary
log-softmax: log-probs, entropy, argmax, KL and gradients, in float64 to 1e-6, over padded and packed layouts,
temperature != 1, tied and untied heads."""
from __future__ import annotations

import copy

import naive_rl
import numpy as np
import pytest
import torch

from agentrl.config import AlgoConfig, TrainerConfig
from agentrl.trainer.batch import collate
from agentrl.trainer.head import head_logprobs
from agentrl.trainer.logprobs import full_vocab_logprobs, token_logprobs
from agentrl.trainer.step import rl_step, warm_start_step
from agentrl.types import Status, TrajectoryBuilder

TIGHT = {"rtol": 1e-6, "atol": 1e-9}


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("tile", [(64 * 7, 64), (1 << 20, 8192)])  # several row and vocabulary tiles; one tile
def test_head_equals_the_full_log_softmax_values_and_gradients(temperature: float, bias: bool,
                                                               tile: tuple[int, int]) -> None:
    g = torch.Generator().manual_seed(0)
    N, D, V = 37, 16, 1000
    h = torch.randn(N, D, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(V, D, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(V, generator=g, dtype=torch.float64, requires_grad=True) if bias else None
    y = torch.randint(0, V, (N,), generator=g)
    y[:3] = torch.nn.functional.linear(h[:3], w, b).argmax(-1)  # some targets are the argmax
    inputs = [h, w] + ([b] if bias else [])
    logp, ent, top = head_logprobs(h, w, b, y, temperature, "grad", *tile)
    ref_logp, ref_ent, ref_top = naive_rl.reference_head(h, w, b, y, temperature)
    torch.testing.assert_close(logp, ref_logp, **TIGHT)
    torch.testing.assert_close(ent, ref_ent, **TIGHT)
    assert torch.equal(top, ref_top) and top[:3].all()
    g_lp, g_ent = torch.randn(N, generator=g, dtype=torch.float64), torch.randn(N, generator=g, dtype=torch.float64)
    ours = torch.autograd.grad((logp * g_lp).sum() + (ent * g_ent).sum(), inputs)
    ref = torch.autograd.grad((ref_logp * g_lp).sum() + (ref_ent * g_ent).sum(), inputs)
    for a, r in zip(ours, ref):
        torch.testing.assert_close(a, r, **TIGHT)


def test_entropy_modes_and_empty_rows() -> None:
    h = torch.randn(5, 8, requires_grad=True)
    w = torch.randn(50, 8, requires_grad=True)
    y = torch.randint(0, 50, (5,))
    logp, ent, _ = head_logprobs(h, w, None, y, entropy="none")
    assert torch.equal(ent, torch.zeros(5)) and not ent.requires_grad and logp.requires_grad
    _, ent, _ = head_logprobs(h, w, None, y, entropy="value")
    assert not ent.requires_grad and torch.allclose(ent, naive_rl.reference_head(h, w, None, y)[1])
    logp, _, _ = head_logprobs(h[:0], w, None, y[:0])  # a rank's empty stand-in: zero gradients, still a graph
    gh, gw = torch.autograd.grad(logp.sum(), [h, w])
    assert logp.shape == (0,) and not gh.any() and not gw.any()


def test_bf16_autocast_is_within_bf16_rounding() -> None:
    g = torch.Generator().manual_seed(1)
    h, w = torch.randn(20, 32, generator=g), torch.randn(300, 32, generator=g) * 0.2
    y = torch.randint(0, 300, (20,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, ent, _ = head_logprobs(h, w, None, y)
    ref_logp, ref_ent, _ = naive_rl.reference_head(h, w, None, y)
    assert logp.dtype == torch.float32
    torch.testing.assert_close(logp, ref_logp, rtol=0, atol=0.05)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=0.05)


def _model(tied: bool) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(3)
    cfg = Qwen2Config(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, tie_word_embeddings=tied, max_position_embeddings=128)
    model = Qwen2ForCausalLM(cfg).double()
    with torch.no_grad():  # a visible entropy and larger logits than the tiny init gives
        model.get_output_embeddings().weight.mul_(8.0)
    return model


def _batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    trajs = []
    for k in range(8):
        b = TrajectoryBuilder()
        for _ in range(int(rng.integers(1, 4))):
            b.add_context(rng.integers(3, 97, int(rng.integers(2, 9))).tolist())
            n = int(rng.integers(1, 7))
            b.add_action(rng.integers(3, 97, n).tolist(), (-rng.random(n) * 4).tolist(), 0, 0)
        trajs.append(b.build(traj_id=str(k), task="ab"[k % 2], index="0", group_id=f"g{k // 4}",
                             reward=float(rng.random()), status=Status.COMPLETED, num_turns=1))
    batch = collate(trajs, [t.reward for t in trajs], pad_id=0)
    batch.behaviour_logp = batch.behaviour_logp.double()
    return batch


@pytest.mark.parametrize("tied", [True, False])
def test_token_logprobs_equal_the_full_vocabulary_path(tied: bool) -> None:
    model, batch = _model(tied), _batch()
    lean, ent = token_logprobs(model, batch.tokens, batch.attention, 0.8, entropy=True)
    full, log_probs = full_vocab_logprobs(model, batch.tokens, batch.attention, 0.8)
    torch.testing.assert_close(lean, full, **TIGHT)
    torch.testing.assert_close(ent, -(log_probs.exp() * log_probs).sum(-1), **TIGHT)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("packed, micro_batch_tokens", [(False, 10_000), (False, 40), (True, 40)])
def test_rl_step_equals_the_naive_full_vocabulary_update(tied: bool, packed: bool, micro_batch_tokens: int) -> None:
    model, batch = _model(tied), _batch()
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    algo = AlgoConfig(kl_coef=0.3, entropy_coef=0.05)
    trainer = TrainerConfig(grad_clip=0.0, packing=packed, micro_batch_tokens=micro_batch_tokens)
    loss, want = naive_rl.rl_loss(model, batch, algo, 0.8, ref)
    expected = naive_rl.update(model, loss)
    m = copy.deepcopy(model)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    stats = rl_step(m, torch.optim.SGD(m.parameters(), lr=1.0), batch, algo, trainer, 0.8, ref)
    scale = max(float(v.abs().max()) for v in expected.values())
    assert scale > 1e-4
    for k, v in m.state_dict().items():
        torch.testing.assert_close(v - before[k], expected[k], rtol=1e-6, atol=1e-6 * scale, msg=k)
    for k in want:  # rl_step's statistics pass through float32
        assert stats[k] == pytest.approx(want[k], rel=1e-5, abs=1e-7), k
    assert stats["entropy"] > 0.1 and stats["kl"] > 0


@pytest.mark.parametrize("all_tokens", [False, True])
def test_sft_step_equals_the_naive_update_and_counts_argmax_hits(all_tokens: bool) -> None:
    model, batch = _model(True), _batch(1)
    with torch.no_grad():  # each row's last action token becomes the model's argmax there: some hits to count
        greedy = full_vocab_logprobs(model, batch.tokens, batch.attention)[1].argmax(-1)  # [B, T-1]
        last = (batch.mask * torch.arange(batch.mask.shape[1])).argmax(-1)  # [B]
        batch.tokens[torch.arange(len(last)), last + 1] = greedy[torch.arange(len(last)), last]
    loss, acc = naive_rl.sft_loss(model, batch, all_tokens)
    expected = naive_rl.update(model, loss)
    m = copy.deepcopy(model)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    stats = warm_start_step(m, torch.optim.SGD(m.parameters(), lr=1.0), batch,
                     TrainerConfig(grad_clip=0.0, micro_batch_tokens=30, warm_start_all_tokens=all_tokens))
    scale = max(float(v.abs().max()) for v in expected.values())
    for k, v in m.state_dict().items():
        torch.testing.assert_close(v - before[k], expected[k], rtol=1e-6, atol=1e-6 * scale, msg=k)
    assert stats["sft_loss"] == pytest.approx(float(loss.detach()), rel=1e-6)
    assert stats["sft_token_acc"] == pytest.approx(acc) and 0 < acc < 1
