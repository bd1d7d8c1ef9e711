"""Group advantage estimators against Python loops, hand-computed cases and edge cases."""
from __future__ import annotations

import math

import pytest
import torch

from agentrl.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    token_advantages,
)

EPS = 1e-6


def _groups(rewards: list[float], groups: list[int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for j, g in enumerate(groups):
        out.setdefault(g, []).append(j)
    return out


def _pop_std(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def ref_grpo(rewards: list[float], groups: list[int]) -> list[float]:
    out = [0.0] * len(rewards)
    for members in _groups(rewards, groups).values():
        rs = [rewards[j] for j in members]
        if len(rs) == 1 or max(rs) == min(rs):
            continue
        m, s = sum(rs) / len(rs), _pop_std(rs)
        for j in members:
            out[j] = (rewards[j] - m) / (s + EPS)
    return out


def ref_rloo(rewards: list[float], groups: list[int]) -> list[float]:
    out = [0.0] * len(rewards)
    for members in _groups(rewards, groups).values():
        if len(members) == 1:
            continue
        for j in members:
            others = [rewards[k] for k in members if k != j]
            out[j] = rewards[j] - sum(others) / len(others)
    return out


def ref_reinforce_pp(rewards: list[float], groups: list[int]) -> list[float]:
    centred = [0.0] * len(rewards)
    for members in _groups(rewards, groups).values():
        m = sum(rewards[j] for j in members) / len(members)
        for j in members:
            centred[j] = rewards[j] - m
    s = math.sqrt(sum(c * c for c in centred) / len(centred))
    return [c / (s + EPS) for c in centred]


REFS = {"grpo": ref_grpo, "rloo": ref_rloo, "reinforce_pp": ref_reinforce_pp}


def _random_batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    num_groups = int(torch.randint(1, 7, (1,), generator=g))
    sizes = torch.randint(1, 9, (num_groups,), generator=g)
    group_index = torch.repeat_interleave(torch.arange(num_groups), sizes)
    group_index = group_index[torch.randperm(len(group_index), generator=g)]  # groups interleaved
    # Binary-ish rewards (typical of agent tasks, many constant groups) mixed with continuous ones.
    if seed % 2:
        rewards = torch.randint(0, 2, group_index.shape, generator=g).double()
    else:
        rewards = torch.randn(group_index.shape, generator=g, dtype=torch.float64)
    return rewards, group_index


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
@pytest.mark.parametrize("seed", range(8))
def test_matches_loop_reference(name: str, seed: int) -> None:
    rewards, group_index = _random_batch(seed)
    got = ADVANTAGE_ESTIMATORS[name](rewards, group_index, EPS)
    want = torch.tensor(REFS[name](rewards.tolist(), group_index.tolist()), dtype=torch.float64)
    assert got.shape == rewards.shape and got.dtype == rewards.dtype
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_grpo_hand_computed() -> None:
    # mean 0.5, population std 0.5 → ±1 (a sample std, sqrt(1/3), would give ±0.866).
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64), torch.zeros(4, dtype=torch.long))
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=torch.float64) / (1 + 2 * EPS))


def test_rloo_hand_computed() -> None:
    # R = [1, 0, 0, 1]: others' mean for j=0 is 1/3, so A_0 = 2/3; for j=1, 2/3 → A_1 = −2/3.
    adv = rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64), torch.zeros(4, dtype=torch.long))
    torch.testing.assert_close(adv, torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3], dtype=torch.float64))


def test_reinforce_pp_hand_computed() -> None:
    # Groups {1, 0} and {3, 3}: centred [0.5, −0.5, 0, 0], batch population std sqrt(0.5/4).
    r = torch.tensor([1.0, 0.0, 3.0, 3.0], dtype=torch.float64)
    adv = reinforce_pp_advantages(r, torch.tensor([0, 0, 1, 1]))
    s = math.sqrt(0.125)
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, 0.0, 0.0], dtype=torch.float64) / (s + EPS))


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_singleton_and_constant_groups_are_exactly_zero(name: str) -> None:
    # 0.1 three times: the float mean is not exactly 0.1, yet the advantage must be exactly 0.
    rewards = torch.tensor([0.7, 0.1, 0.1, 0.1, 1.0, 0.0], dtype=torch.float32)
    group_index = torch.tensor([0, 1, 1, 1, 2, 2])
    adv = ADVANTAGE_ESTIMATORS[name](rewards, group_index, EPS)
    assert adv[:4].eq(0).all()
    assert adv[4] > 0 > adv[5]


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_empty_batch_and_all_constant(name: str) -> None:
    empty = ADVANTAGE_ESTIMATORS[name](torch.zeros(0), torch.zeros(0, dtype=torch.long), EPS)
    assert empty.shape == (0,)
    flat = ADVANTAGE_ESTIMATORS[name](torch.ones(4), torch.tensor([0, 0, 1, 1]), EPS)
    assert flat.eq(0).all()


def test_token_advantages() -> None:
    seq_adv = torch.tensor([2.0, -1.0, 5.0])
    mask = torch.tensor([[0, 1, 1], [1, 0, 0], [0, 0, 0]], dtype=torch.uint8)
    got = token_advantages(seq_adv, mask)
    want = torch.tensor([[0.0, 2.0, 2.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(got, want)
    for b in range(3):  # loop reference, bool mask
        for t in range(3):
            assert token_advantages(seq_adv, mask.bool())[b, t] == (seq_adv[b] if mask[b, t] else 0.0)


def test_informative_groups_against_a_loop() -> None:
    from agentrl.algorithms.advantages import informative_groups

    g = torch.Generator().manual_seed(3)
    for _ in range(5):
        group = torch.randint(0, 6, (40,), generator=g)
        rewards = torch.randint(0, 2, (40,), generator=g).float()
        got = informative_groups(rewards, group)
        want = [len({float(r) for r, gg in zip(rewards, group) if gg == group[i]}) > 1 for i in range(40)]
        assert got.tolist() == want
    # hand case: group 0 mixed, group 1 all equal, group 2 a single trajectory
    r = torch.tensor([1.0, 0.0, 0.5, 0.5, 1.0])
    assert informative_groups(r, torch.tensor([0, 0, 1, 1, 2])).tolist() == [True, True, False, False, False]
