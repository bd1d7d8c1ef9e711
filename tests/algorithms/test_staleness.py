"""Staleness, the freshness filter and truncated importance weights."""
from __future__ import annotations

import math

import pytest
import torch

from agentrl.algorithms.ppo import ppo_loss
from agentrl.algorithms.staleness import fresh_mask, staleness, truncated_is_weights


@pytest.mark.parametrize("seed", range(6))
def test_staleness_matches_loop(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    b, t, current = 6, 10, 40
    version = torch.randint(20, 41, (b, t), generator=g, dtype=torch.int32)
    mask = torch.rand(b, t, generator=g) < 0.5
    version[~mask] = -1
    mask[0] = False
    got = staleness(version, mask, current)
    want = []
    for row_v, row_m in zip(version.tolist(), mask.tolist(), strict=True):
        vs = [v for v, m in zip(row_v, row_m, strict=True) if m]
        want.append(current - min(vs) if vs else 0)
    assert got.dtype == torch.long and got.tolist() == want


def test_staleness_hand_computed() -> None:
    version = torch.tensor([[-1, 7, 7, -1, 9], [-1, -1, -1, -1, -1], [10, 10, 10, 10, 10]])
    mask = version >= 0
    assert staleness(version, mask, 10).tolist() == [3, 0, 0]
    assert staleness(torch.zeros(3, 0, dtype=torch.int32), torch.zeros(3, 0), 5).tolist() == [0, 0, 0]


def test_fresh_mask() -> None:
    s = torch.tensor([0, 1, 2, 5])
    assert fresh_mask(s, 0).tolist() == [True, False, False, False]
    assert fresh_mask(s, 2).tolist() == [True, True, True, False]
    with pytest.raises(ValueError):
        fresh_mask(s, -1)


@pytest.mark.parametrize("seed", range(4))
def test_truncated_is_weights_matches_loop(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    prox = -torch.rand(3, 7, generator=g, dtype=torch.float64) * 3
    beh = -torch.rand(3, 7, generator=g, dtype=torch.float64) * 3
    mask = torch.rand(3, 7, generator=g) < 0.6
    beh[~mask] = -torch.inf
    w = truncated_is_weights(prox, beh, mask, bound=2.0)
    for b in range(3):
        for t in range(7):
            want = min(math.exp(prox[b, t].item() - beh[b, t].item()), 2.0) if mask[b, t] else 0.0
            assert w[b, t].item() == pytest.approx(want, rel=1e-12)


def test_truncated_is_weights_hand_computed_and_constant() -> None:
    prox = torch.tensor([[0.0, 0.0, math.log(0.5)]], requires_grad=True)
    beh = torch.tensor([[math.log(0.25), 0.0, 0.0]])
    w = truncated_is_weights(prox, beh, torch.tensor([[1, 1, 1]]), bound=2.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 1.0, 0.5]]))  # 4 truncated to 2
    assert not w.requires_grad
    with pytest.raises(ValueError):
        truncated_is_weights(prox, beh, torch.ones(1, 3), bound=0.0)


def test_weighted_advantage_equals_weighted_token_loss() -> None:
    """The decoupled-PPO recipe in the module docstring: scaling A by w scales each token's loss by w."""
    g = torch.Generator().manual_seed(0)
    logp, prox = torch.randn(4, 5, generator=g) * 0.3 - 1, torch.full((4, 5), -1.0)
    adv, w = torch.randn(4, 5, generator=g), torch.rand(4, 5, generator=g) * 2
    mask = torch.ones(4, 5)
    scaled, _ = ppo_loss(logp, prox, adv * w, mask, 0.2, 0.2, dual_clip=3.0, reduction="token_sum")
    per_token = [ppo_loss(logp[b:b + 1, t:t + 1], prox[b:b + 1, t:t + 1], adv[b:b + 1, t:t + 1],
                          mask[b:b + 1, t:t + 1], 0.2, 0.2, dual_clip=3.0)[0] * w[b, t]
                 for b in range(4) for t in range(5)]
    torch.testing.assert_close(scaled, torch.stack(per_token).sum())
