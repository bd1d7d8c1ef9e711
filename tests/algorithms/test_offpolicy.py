"""Decoupled PPO and truncated IS: hand-computed cases and a naive per-token loop reference."""
from __future__ import annotations

import math

import pytest
import torch

from agentrl.algorithms.offpolicy import BEHAVIOUR_WEIGHTS, decoupled_ppo_loss, tis_ppo_loss
from agentrl.algorithms.ppo import ppo_loss


def ref_weight(mode: str, rhos: list[float], t: int, lo: float, hi: float) -> float:
    """Weight of token t of a sequence whose action-token ratios are `rhos`."""
    r = rhos[t]
    if mode == "none":
        return 1.0
    if mode == "truncate":
        return min(max(r, lo), hi)
    if mode == "mask":
        return r if lo <= r <= hi else 0.0
    geo = math.exp(sum(math.log(x) for x in rhos) / len(rhos))
    return min(max(geo, lo), hi)


def ref_decoupled(logp, prox, beh, adv, mask, lo, hi, c, mode, is_lo, is_hi) -> float:
    """Token mean of w·ℓ over action tokens, one token at a time."""
    total, n = 0.0, 0
    for b in range(len(logp)):
        idx = [t for t in range(len(logp[b])) if mask[b][t]]
        rhos = [math.exp(prox[b][t] - beh[b][t]) for t in idx]
        for k, t in enumerate(idx):
            r = math.exp(logp[b][t] - prox[b][t])
            a = adv[b][t]
            loss = max(-a * r, -a * min(max(r, 1 - lo), 1 + hi))
            if c > 0 and a < 0:
                loss = min(loss, -c * a)
            total += ref_weight(mode, rhos, k, is_lo, is_hi) * loss
            n += 1
    return total / max(n, 1)


@pytest.mark.parametrize("mode", sorted(BEHAVIOUR_WEIGHTS))
@pytest.mark.parametrize("seed", range(4))
def test_decoupled_matches_loop_reference(seed: int, mode: str) -> None:
    g = torch.Generator().manual_seed(seed)
    b, t = 4, 8
    beh = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    prox = beh + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.7
    logp = prox + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.4
    adv = torch.randn(b, t, generator=g, dtype=torch.float64)
    mask = torch.rand(b, t, generator=g) < 0.7
    mask[2] = False
    logp[~mask], beh[~mask] = torch.nan, -torch.inf  # garbage at masked positions must not leak
    c, is_lo, is_hi = (3.0 if seed % 2 else 0.0), (0.5 if mode == "mask" else 0.0), 1.5
    loss, stats = decoupled_ppo_loss(logp, prox, beh, adv, mask, 0.2, 0.28, dual_clip=c, weight=mode,
                                     is_low=is_lo, is_high=is_hi)
    want = ref_decoupled(logp.tolist(), prox.tolist(), beh.tolist(), adv.tolist(), mask.tolist(),
                         0.2, 0.28, c, mode, is_lo, is_hi)
    assert loss.item() == pytest.approx(want, rel=1e-10, abs=1e-12)
    assert 0 <= stats["is_zero_frac"].item() <= 1 and stats["behaviour_kl"].item() >= 0


def test_decoupled_hand_computed() -> None:
    one = torch.tensor([[1]])
    # μ = 0.25, π_prox = 1 (ρ = 4, truncated to 2), π_θ = e^0.1 · π_prox (inside the clip), A = 1:
    # loss = −2 · e^0.1
    loss, stats = decoupled_ppo_loss(torch.tensor([[0.1]]), torch.tensor([[0.0]]), torch.tensor([[math.log(0.25)]]),
                                     torch.tensor([[1.0]]), one, 0.2, 0.2)
    assert loss.item() == pytest.approx(-2 * math.exp(0.1)) and stats["is_weight_mean"].item() == pytest.approx(2.0)
    # Same token, A = −1, π_θ/π_prox = 10, dual clip 3: PPO gives 10, dual clip 3, weight 2 → 6
    loss, stats = decoupled_ppo_loss(torch.tensor([[math.log(10)]]), torch.tensor([[0.0]]),
                                     torch.tensor([[math.log(0.25)]]), torch.tensor([[-1.0]]), one, 0.2, 0.2,
                                     dual_clip=3.0)
    assert loss.item() == pytest.approx(6.0) and stats["dual_clipfrac"].item() == 1.0
    # Rejection: ρ = 4 is outside [0.5, 2] → weight 0, but the token still counts: (0 + (−1)) / 2
    loss, stats = decoupled_ppo_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[math.log(0.25), 0.0]]),
                                     torch.ones(1, 2), torch.ones(1, 2), 0.2, 0.2, weight="mask", is_low=0.5)
    assert loss.item() == pytest.approx(-0.5) and stats["is_zero_frac"].item() == pytest.approx(0.5)
    # Sequence level: ρ = 4 and 1/4 → geometric mean 1 → weight 1 on both
    loss, _ = decoupled_ppo_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[math.log(0.25), math.log(4)]]),
                                 torch.ones(1, 2), torch.ones(1, 2), 0.2, 0.2, weight="seq_truncate")
    assert loss.item() == pytest.approx(-1.0)


def test_on_policy_reduces_to_ppo_and_weights_carry_no_gradient() -> None:
    g = torch.Generator().manual_seed(0)
    beh = -torch.rand(3, 5, generator=g)
    logp = (beh + torch.randn(3, 5, generator=g) * 0.3).requires_grad_()
    adv, mask = torch.randn(3, 5, generator=g), torch.rand(3, 5, generator=g) < 0.8
    prox = beh.clone().requires_grad_()
    got, _ = decoupled_ppo_loss(logp, prox, beh, adv, mask, 0.2, 0.2, dual_clip=3.0)
    want, _ = ppo_loss(logp, beh, adv, mask, 0.2, 0.2, dual_clip=3.0)  # π_prox = μ: w = 1
    torch.testing.assert_close(got, want)
    got.backward()
    assert prox.grad is None  # the anchor and the weight are constants
    assert logp.grad is not None and logp.grad.abs().sum() > 0


def test_tis_is_decoupled_with_truncation() -> None:
    g = torch.Generator().manual_seed(1)
    beh, old = -torch.rand(2, 6, generator=g), -torch.rand(2, 6, generator=g)
    logp, adv, mask = old + 0.1, torch.randn(2, 6, generator=g), torch.ones(2, 6)
    a, _ = tis_ppo_loss(logp, old, beh, adv, mask, 0.2, 0.2, cap=1.5)
    b, _ = decoupled_ppo_loss(logp, old, beh, adv, mask, 0.2, 0.2, weight="truncate", is_high=1.5)
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError):
        tis_ppo_loss(logp, old, beh, adv, mask, 0.2, 0.2, cap=0.0)



@pytest.mark.parametrize("seed", range(4))
def test_truncated_weights_match_loop(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    prox = -torch.rand(3, 7, generator=g, dtype=torch.float64) * 3
    beh = -torch.rand(3, 7, generator=g, dtype=torch.float64) * 3
    mask = torch.rand(3, 7, generator=g) < 0.6
    beh[~mask] = -torch.inf
    w = BEHAVIOUR_WEIGHTS["truncate"](prox, beh, mask, 0.0, 2.0)
    for b in range(3):
        for t in range(7):
            want = min(math.exp(prox[b, t].item() - beh[b, t].item()), 2.0) if mask[b, t] else 0.0
            assert w[b, t].item() == pytest.approx(want, rel=1e-12)


def test_truncated_weights_hand_computed_and_constant() -> None:
    prox = torch.tensor([[0.0, 0.0, math.log(0.5)]], requires_grad=True)
    beh = torch.tensor([[math.log(0.25), 0.0, 0.0]])
    w = BEHAVIOUR_WEIGHTS["truncate"](prox, beh, torch.tensor([[1, 1, 1]]), 0.0, 2.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 1.0, 0.5]]))  # 4 truncated to 2
    assert not w.requires_grad
    with pytest.raises(ValueError):
        decoupled_ppo_loss(prox, prox, beh, torch.ones(1, 3), torch.ones(1, 3), 0.2, 0.2, is_high=0.0)


def test_weighted_advantage_equals_weighted_token_loss() -> None:
    """Why `decoupled_ppo_loss` may scale the advantage: scaling A by w scales each token's loss by w."""
    g = torch.Generator().manual_seed(0)
    logp, prox = torch.randn(4, 5, generator=g) * 0.3 - 1, torch.full((4, 5), -1.0)
    adv, w = torch.randn(4, 5, generator=g), torch.rand(4, 5, generator=g) * 2
    mask = torch.ones(4, 5)
    scaled, _ = ppo_loss(logp, prox, adv * w, mask, 0.2, 0.2, dual_clip=3.0, reduction="token_sum")
    per_token = [ppo_loss(logp[b:b + 1, t:t + 1], prox[b:b + 1, t:t + 1], adv[b:b + 1, t:t + 1],
                          mask[b:b + 1, t:t + 1], 0.2, 0.2, dual_clip=3.0)[0] * w[b, t]
                 for b in range(4) for t in range(5)]
    torch.testing.assert_close(scaled, torch.stack(per_token).sum())
