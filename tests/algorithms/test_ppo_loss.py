"""PPO / dual-clip loss, reductions and stats against loops and hand-computed cases."""
from __future__ import annotations

import math

import pytest
import torch

from agentrl.algorithms.ppo import LOSS_REDUCTIONS, masked_mean, ppo_loss


def ref_token_loss(logp: float, blogp: float, a: float, lo: float, hi: float, c: float) -> tuple[float, bool, bool]:
    ratio = math.exp(logp - blogp)
    unclipped, clipped = -a * ratio, -a * min(max(ratio, 1 - lo), 1 + hi)
    loss = max(unclipped, clipped)
    dual = c > 0 and a < 0 and loss > -c * a
    return (-c * a if dual else loss), clipped > unclipped, dual


Grid = list[list[float]]


def ref_ppo(
    logp: Grid, blogp: Grid, adv: Grid, mask: list[list[bool]], lo: float, hi: float, c: float, reduction: str
) -> tuple[float, dict[str, float]]:
    per_seq: list[list[float]] = []
    clipped = dual = 0
    ratios: list[float] = []
    kls: list[float] = []
    for b in range(len(logp)):
        row = []
        for t in range(len(logp[b])):
            if not mask[b][t]:
                continue
            loss, cl, du = ref_token_loss(logp[b][t], blogp[b][t], adv[b][t], lo, hi, c)
            row.append(loss)
            clipped += cl
            dual += du
            r = math.exp(logp[b][t] - blogp[b][t])
            ratios.append(r)
            kls.append(r - 1 - math.log(r))
        per_seq.append(row)
    n = sum(len(r) for r in per_seq)
    seqs = [sum(r) / len(r) for r in per_seq if r]
    total = {
        "token_mean": sum(map(sum, per_seq)) / max(n, 1),
        "token_sum": sum(map(sum, per_seq)),
        "seq_mean": sum(seqs) / max(len(seqs), 1),
        "seq_sum": sum(seqs),
    }[reduction]
    stats = {"clipfrac": clipped / max(n, 1), "dual_clipfrac": dual / max(n, 1),
             "ratio_mean": sum(ratios) / max(n, 1), "ratio_max": max(ratios, default=0.0),
             "approx_kl": sum(kls) / max(n, 1)}
    return total, stats


@pytest.mark.parametrize("reduction", sorted(LOSS_REDUCTIONS))
@pytest.mark.parametrize("seed", range(6))
def test_matches_loop_reference(seed: int, reduction: str) -> None:
    g = torch.Generator().manual_seed(seed)
    b, t = 5, 9
    blogp = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    logp = blogp + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.6
    adv = torch.randn(b, t, generator=g, dtype=torch.float64)
    mask = torch.rand(b, t, generator=g) < 0.7
    mask[1] = False
    logp[~mask] = -torch.inf  # garbage at masked positions must not leak
    lo, hi, c = 0.2, 0.28, (3.0 if seed % 2 else 0.0)
    loss, stats = ppo_loss(logp, blogp, adv, mask, lo, hi, dual_clip=c, reduction=reduction)
    want, want_stats = ref_ppo(logp.tolist(), blogp.tolist(), adv.tolist(), mask.tolist(), lo, hi, c, reduction)
    assert loss.item() == pytest.approx(want, rel=1e-10, abs=1e-12)
    for k, v in want_stats.items():
        assert stats[k].item() == pytest.approx(v, rel=1e-10, abs=1e-12), k


def _one(logp: float, adv: float, dual_clip: float = 0.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    return ppo_loss(torch.tensor([[logp]]), torch.tensor([[0.0]]), torch.tensor([[adv]]), torch.tensor([[1]]),
                    0.2, 0.2, dual_clip=dual_clip)


def test_hand_computed_cases() -> None:
    loss, stats = _one(1.0, +1.0)  # ratio e, positive advantage → clipped to 1.2, loss −1.2
    assert loss.item() == pytest.approx(-1.2) and stats["clipfrac"].item() == 1.0
    loss, stats = _one(math.log(10), -1.0, dual_clip=3.0)  # ratio 10, adv −1: PPO gives 10, dual clip 3
    assert loss.item() == pytest.approx(3.0) and stats["dual_clipfrac"].item() == 1.0
    loss, stats = _one(math.log(10), -1.0)  # without dual clip the pessimistic loss is 10
    assert loss.item() == pytest.approx(10.0) and stats["clipfrac"].item() == 0.0
    loss, _ = _one(math.log(0.5), +1.0)  # ratio 0.5, adv +1: unclipped side wins, loss −0.5
    assert loss.item() == pytest.approx(-0.5)
    loss, stats = _one(math.log(0.5), -1.0)  # ratio 0.5, adv −1: clipped to 0.8, loss 0.8
    assert loss.item() == pytest.approx(0.8) and stats["clipfrac"].item() == 1.0
    loss, stats = _one(0.0, 2.0)  # on-policy: loss −A, kl 0
    assert loss.item() == pytest.approx(-2.0) and stats["approx_kl"].item() == 0.0


def test_gradients() -> None:
    logp = torch.tensor([[1.0, 0.0, math.log(10), 0.05, -torch.inf]], requires_grad=True)
    adv = torch.tensor([[1.0, 2.0, -1.0, 1.0, 7.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    loss, _ = ppo_loss(logp, torch.zeros(1, 5), adv, mask, 0.2, 0.2, dual_clip=3.0)
    loss.backward()
    assert logp.grad is not None
    # clipped → 0; on-policy → −A/N; dual-clipped → 0; inside the clip → −A·ratio/N; masked → 0.
    want = torch.tensor([[0.0, -2.0 / 4, 0.0, -math.exp(0.05) / 4, 0.0]])
    torch.testing.assert_close(logp.grad, want)


def test_reductions_hand_computed() -> None:
    loss = torch.tensor([[1.0, 3.0, 100.0], [5.0, 0.0, 0.0], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    assert LOSS_REDUCTIONS["token_mean"](loss, mask).item() == pytest.approx(3.0)  # (1+3+5)/3
    assert LOSS_REDUCTIONS["seq_mean"](loss, mask).item() == pytest.approx(3.5)  # (2+5)/2, empty row left out
    assert LOSS_REDUCTIONS["token_sum"](loss, mask).item() == pytest.approx(9.0)
    assert LOSS_REDUCTIONS["seq_sum"](loss, mask).item() == pytest.approx(7.0)
    empty = torch.zeros(2, 3)
    for reduce in LOSS_REDUCTIONS.values():
        assert reduce(loss[:2], empty).item() == 0.0


def test_all_masked_batch_and_bad_dual_clip() -> None:
    logp = torch.zeros(2, 3, requires_grad=True)
    loss, stats = ppo_loss(logp, torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2, 3), 0.2, 0.2)
    loss.backward()
    assert loss.item() == 0.0 and all(v.item() == 0.0 for v in stats.values())
    assert logp.grad is not None and logp.grad.eq(0).all()
    with pytest.raises(ValueError):
        ppo_loss(logp, logp, logp, logp, 0.2, 0.2, dual_clip=0.5)


def test_masked_mean() -> None:
    x = torch.tensor([[1.0, 2.0, torch.nan], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_mean(x, mask).item() == pytest.approx(7 / 3)
    torch.testing.assert_close(masked_mean(x, mask, dim=1), torch.tensor([1.5, 4.0]))
