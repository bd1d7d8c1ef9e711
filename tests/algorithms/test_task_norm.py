"""Task advantage normalization: statistics, loop reference, edge cases, and that it changes the update."""
from __future__ import annotations

import math

import pytest
import torch

from agentrl.algorithms.advantages import grpo_advantages, token_advantages
from agentrl.algorithms.ppo import ppo_loss
from agentrl.algorithms.task_norm import task_normalize, task_stats

EPS = 1e-6


def ref_task_normalize(adv: list[list[float]], mask: list[list[int]], tasks: list[int]) -> list[list[float]]:
    out = [[0.0] * len(row) for row in adv]
    for task in set(tasks):
        vals = [adv[b][t] for b in range(len(adv)) if tasks[b] == task for t in range(len(adv[b])) if mask[b][t]]
        if not vals or max(vals) == min(vals):
            continue
        mu = sum(vals) / len(vals)
        sd = math.sqrt(sum((v - mu) ** 2 for v in vals) / len(vals))
        for b in range(len(adv)):
            if tasks[b] != task:
                continue
            for t in range(len(adv[b])):
                if mask[b][t]:
                    out[b][t] = (adv[b][t] - mu) / (sd + EPS)
    return out


def _random_batch(seed: int, num_tasks: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    b, t = int(torch.randint(1, 12, (1,), generator=g)), int(torch.randint(1, 20, (1,), generator=g))
    adv = torch.randn(b, t, generator=g, dtype=torch.float64) * 3 + 1
    mask = torch.rand(b, t, generator=g) < 0.6
    mask[0] = False  # an all-masked sequence
    tasks = torch.randint(0, num_tasks, (b,), generator=g)
    return adv, mask, tasks


@pytest.mark.parametrize("seed", range(10))
def test_matches_loop_reference(seed: int) -> None:
    adv, mask, tasks = _random_batch(seed)
    got = task_normalize(adv, mask, tasks, EPS)
    want = torch.tensor(ref_task_normalize(adv.tolist(), mask.int().tolist(), tasks.tolist()), dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("seed", range(10))
def test_each_task_has_zero_mean_unit_std(seed: int) -> None:
    adv, mask, tasks = _random_batch(seed)
    out = task_normalize(adv, mask, tasks, eps=0.0)
    assert out[~mask].eq(0).all()
    for task in tasks.unique():
        vals = out[tasks == task][mask[tasks == task]]
        if len(vals) >= 2:
            assert abs(vals.mean().item()) < 1e-5
            assert abs(vals.std(unbiased=False).item() - 1.0) < 1e-5


def test_edge_cases_constant_empty_and_unused_tasks() -> None:
    adv = torch.tensor([[1.0, 1.0, 9.0], [1.0, 0.0, 0.0], [3.0, -1.0, 2.0], [5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 0], [0, 0, 0]])
    tasks = torch.tensor([0, 0, 3, 1])  # task 0 constant over its action tokens, 1 empty, 2 unused
    out = task_normalize(adv, mask, tasks)
    assert out[:2].eq(0).all() and out[3].eq(0).all()
    torch.testing.assert_close(out[2], torch.tensor([1.0, -1.0, 0.0]) / (1 + EPS))  # mean 1, std 2
    count, mean, std, constant = task_stats(adv, mask, tasks)
    assert count.tolist() == [3.0, 0.0, 0.0, 2.0] and constant.tolist() == [True, True, True, False]
    torch.testing.assert_close(mean, torch.tensor([1.0, 0.0, 0.0, 1.0]))
    torch.testing.assert_close(std, torch.tensor([0.0, 0.0, 0.0, 2.0]))
    assert task_normalize(torch.zeros(0, 5), torch.zeros(0, 5), torch.zeros(0, dtype=torch.long)).shape == (0, 5)
    assert task_normalize(torch.zeros(2, 0), torch.zeros(2, 0), torch.tensor([0, 1])).shape == (2, 0)


def test_changes_the_policy_gradient() -> None:
    """Applied before the loss, normalization must change d loss / d logp (the public AgentRL code once
    applied it after the update, where it changed nothing)."""
    # Two tasks with different reward scales and lengths: task 0 rewards in {0, 1}, task 1 in {0, 10}.
    rewards = torch.tensor([1.0, 0.0, 10.0, 0.0, 10.0, 10.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    tasks = torch.tensor([0, 0, 1, 1, 1, 1])
    mask = torch.zeros(6, 8)
    for b, n in enumerate([2, 3, 8, 6, 5, 7]):
        mask[b, :n] = 1
    adv = token_advantages(grpo_advantages(rewards, groups), mask)
    behaviour = torch.full((6, 8), -1.0)

    def grad(a: torch.Tensor) -> torch.Tensor:
        logp = behaviour.clone().requires_grad_(True)
        loss, _ = ppo_loss(logp, behaviour, a, mask, 0.2, 0.2, dual_clip=3.0)
        loss.backward()
        assert logp.grad is not None
        return logp.grad

    g_plain, g_norm = grad(adv), grad(task_normalize(adv, mask, tasks))
    assert not torch.allclose(g_plain, g_norm)
    # At ratio 1 the gradient per token is −adv / N: the normalized one gives each task zero net push.
    torch.testing.assert_close(g_norm, -task_normalize(adv, mask, tasks) / mask.sum())
    for task in (0, 1):
        assert abs(g_norm[tasks == task].sum().item()) < 1e-6
