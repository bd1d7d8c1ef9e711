"""Evaluation statistics, three ways: against naive references (pass@k by enumerating subsets, the t
interval from a published t table), hand-computed cases, and edge cases (n < k, c = 0, c = n)."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from agentrl.monitor.eval_stats import (
    STATUSES,
    bootstrap_interval,
    mean_pass_at_k,
    normal_quantile,
    pass_at_k,
    status_rates,
    t_interval,
    t_quantile,
    wilson_interval,
)


def naive_pass_at_k(outcomes: list[int], k: int) -> float:
    """The definition: the fraction of k-subsets of the samples that hold at least one success."""
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n,c,k", [(n, c, k) for n in range(1, 9) for c in range(n + 1) for k in range(1, n + 1)])
def test_pass_at_k_equals_subset_enumeration(n, c, k):
    outcomes = [1] * c + [0] * (n - c)
    assert pass_at_k(n, c, k) == pytest.approx(naive_pass_at_k(outcomes, k), abs=1e-12)


def test_pass_at_k_by_hand():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # pass@1 is c/n
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(10, 3, 4) == pytest.approx(1 - 35 / 210)  # C(7,4)=35, C(10,4)=210


def test_pass_at_k_edges_and_large_n():
    assert pass_at_k(8, 0, 3) == 0.0
    assert pass_at_k(8, 8, 3) == 1.0
    assert pass_at_k(8, 6, 3) == 1.0  # n - c = 2 < k: every 3 draws hold a success
    with pytest.raises(ValueError, match="cannot be estimated"):
        pass_at_k(3, 1, 4)  # n < k
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 0)
    # C(1000, 500) overflows a float; the product form does not: exact value via integers.
    exact = 1 - math.comb(990, 500) / math.comb(1000, 500)
    assert pass_at_k(1000, 10, 500) == pytest.approx(exact, rel=1e-12)


def test_mean_pass_at_k_averages_samples():
    assert mean_pass_at_k([(4, 1), (4, 0), (4, 4)], 2) == pytest.approx((0.5 + 0.0 + 1.0) / 3)


@pytest.mark.parametrize("df,expected", [(1, 12.7062047), (2, 4.3026527), (3, 3.1824463), (4, 2.7764451),
                                         (9, 2.2621572), (30, 2.0422725), (1000, 1.9623391)])
def test_t_quantile_matches_the_t_table(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=1e-6)


def test_t_interval_by_hand():
    # Four runs: 0.6, 0.7, 0.8, 0.7 -> mean 0.7, s = sqrt(0.02/3), half = 3.1824 * s / 2.
    iv = t_interval([0.6, 0.7, 0.8, 0.7])
    s = math.sqrt(0.02 / 3)
    assert iv.mean == pytest.approx(0.7)
    assert iv.half_width == pytest.approx(3.18245 * s / 2, rel=1e-4)
    assert (iv.lo, iv.hi) == pytest.approx((0.7 - iv.half_width, 0.7 + iv.half_width))
    one = t_interval([0.5])
    assert one.mean == 0.5 and math.isnan(one.lo) and one.to_dict()["lo"] is None
    same = t_interval([0.3, 0.3, 0.3])
    assert (same.lo, same.hi) == pytest.approx((0.3, 0.3))


def test_bootstrap_interval_against_a_loop_and_coverage():
    values = [1.0, 0.0, 1.0, 1.0, 0.0, 0.5, 0.25, 1.0]
    iv = bootstrap_interval(values, resamples=500, seed=3)
    rng = np.random.default_rng(3)  # the same draws, one resample at a time
    idx = rng.integers(0, len(values), size=(500, len(values)))
    means = sorted(sum(values[j] for j in row) / len(values) for row in idx)
    assert iv.mean == pytest.approx(np.mean(values))
    assert iv.lo == pytest.approx(np.quantile(means, 0.025)) and iv.hi == pytest.approx(np.quantile(means, 0.975))
    assert iv.lo < iv.mean < iv.hi
    assert bootstrap_interval(values, resamples=500, seed=3) == iv  # seeded: reproducible


def test_status_rates_keep_env_errors_in_the_denominator():
    rates = status_rates(["completed", "completed", "env_error", "turn_limit"])
    assert list(rates) == list(STATUSES)
    assert rates["completed"] == 0.5 and rates["env_error"] == 0.25 and rates["turn_limit"] == 0.25
    assert rates["cancelled"] == 0.0 and sum(rates.values()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="unknown"):
        status_rates(["running"])
    assert status_rates([]) == dict.fromkeys(STATUSES, 0.0)


def test_normal_quantile_and_wilson_by_hand():
    assert normal_quantile(0.975) == pytest.approx(1.959964, abs=1e-6)
    assert normal_quantile(0.5) == pytest.approx(0.0, abs=1e-12)
    assert t_quantile(0.975, 1e7) == pytest.approx(normal_quantile(0.975), abs=1e-5)  # t tends to the normal
    # 0 of 8: centre = (z^2/16) / (1 + z^2/8) and the half width equals it, so [0, 2 * centre] = [0, 0.3244].
    none = wilson_interval(0, 8)
    assert none.mean == 0.0 and none.lo == 0.0 and none.hi == pytest.approx(0.324405, abs=1e-5)
    all_ = wilson_interval(8, 8)
    assert all_.hi == 1.0 and all_.lo == pytest.approx(1 - 0.324405, abs=1e-5)  # symmetric
    # 50 of 100: 0.5 ± 1.96 * sqrt(0.25/100 + 1.96^2/40000) / (1 + 1.96^2/100)
    half = 1.959964 * math.sqrt(0.0025 + 1.959964**2 / 40000) / (1 + 1.959964**2 / 100)
    mid = wilson_interval(50, 100)
    assert (mid.lo, mid.hi) == pytest.approx((0.5 - half, 0.5 + half), abs=1e-9)
    with pytest.raises(ValueError):
        wilson_interval(0, 0)


def test_every_ending_is_a_status_column_with_a_colour() -> None:
    """A status added to the enum (the sandbox's grader_failed) gets a column and a colour without edits here."""
    from agentrl.monitor.eval_stats import STATUSES
    from agentrl.monitor.plots import STATUS_COLORS
    from agentrl.types import Status

    assert set(STATUSES) == {s.value for s in Status} - {"running"}
    assert set(STATUS_COLORS) == set(STATUSES)
