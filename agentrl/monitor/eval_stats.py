"""Evaluation statistics as small pure functions (numpy and the standard library only).

What a paper's evaluation table needs: pass@k by the unbiased estimator, the mean of k runs with a 95%
interval (Student t over runs, or a percentile bootstrap over samples), and the mix of ways episodes
ended, with env errors as a rate of their own inside the denominator (an env error is a failed sample
in the success rate: leaving it out would make a flaky environment look like a better policy).

This module knows nothing about files, tasks or trajectories; `eval_results` aggregates scored
episodes with it.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from agentrl.types import Status

# Every way an episode ends (types.Status without `running`), in the order tables show them: from the enum,
# so a status added there (grader_failed) is a column here too.
STATUSES: tuple[str, ...] = tuple(s.value for s in Status if s is not Status.RUNNING)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k from n samples of which c succeeded: 1 - C(n-c, k) / C(n, k).

    The probability that k samples drawn without replacement from the n contain at least one success.
    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), a product of c factors in [0, 1], which neither
    overflows (C(200, 100) does not fit a float) nor loses the small differences a ratio of huge
    binomials would.

    Raises:
        ValueError: k < 1, c outside [0, n], or k > n (pass@k cannot be estimated from fewer than k
            samples; an evaluation with fewer samples must report a smaller k instead).
    """
    if k < 1:
        raise ValueError(f"pass@k needs k >= 1, got {k}")
    if not 0 <= c <= n:
        raise ValueError(f"{c} successes out of {n} samples")
    if k > n:
        raise ValueError(f"pass@{k} cannot be estimated from {n} samples")
    if n - c < k:  # every draw of k holds a success
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """pass@k of a task: the mean over its samples of `pass_at_k(n_i, c_i, k)`; counts holds (n_i, c_i)."""
    if not counts:
        raise ValueError("pass@k of no samples")
    return float(np.mean([pass_at_k(n, c, k) for n, c in counts]))


def _t_pdf(x: np.ndarray, df: float) -> np.ndarray:
    logc = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return np.exp(logc - (df + 1) / 2 * np.log1p(x * x / df))


def t_quantile(q: float, df: float) -> float:
    """The q-quantile of Student's t distribution with `df` degrees of freedom (q in (0.5, 1)).

    Without scipy: the CDF is 1/2 plus the integral of the density from 0 (Simpson's rule on a fine grid),
    and the quantile is found by bisection; within 1e-6 of the t table for the quantiles intervals use.
    """
    if not 0.5 < q < 1.0:
        raise ValueError(f"t_quantile takes q in (0.5, 1), got {q}")
    if df <= 0:
        raise ValueError(f"t distribution needs df > 0, got {df}")

    def cdf(t: float) -> float:
        m = 4000  # even number of intervals for Simpson's rule
        x = np.linspace(0.0, t, m + 1)
        y = _t_pdf(x, df)
        return 0.5 + (t / m / 3) * float(y[0] + y[-1] + 4 * y[1:-1:2].sum() + 2 * y[2:-1:2].sum())

    lo, hi = 0.0, 1.0
    while cdf(hi) < q:  # the heavy tail of df=1 reaches 63.7 at q=0.995
        lo, hi = hi, hi * 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < q else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class Interval:
    """A mean and its two-sided confidence interval; lo and hi are nan when n < 2 (no spread to measure)."""

    mean: float
    lo: float
    hi: float
    n: int
    confidence: float = 0.95

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2

    def to_dict(self) -> dict[str, float | int | None]:
        def num(x: float) -> float | None:
            return None if math.isnan(x) else x
        return {"mean": self.mean, "lo": num(self.lo), "hi": num(self.hi), "n": self.n,
                "confidence": self.confidence}


def t_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """Mean of `values` (e.g. the success rate of each of k runs) with the Student-t interval
    mean ± t_{(1+confidence)/2, n-1} · s / sqrt(n), s the sample standard deviation (ddof=1)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("an interval of no values")
    mean = float(x.mean())
    if x.size < 2:
        return Interval(mean, math.nan, math.nan, 1, confidence)
    half = t_quantile((1 + confidence) / 2, x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return Interval(mean, mean - half, mean + half, int(x.size), confidence)


def bootstrap_interval(values: Sequence[float], confidence: float = 0.95, resamples: int = 2000,
                       seed: int = 0) -> Interval:
    """Mean of `values` (e.g. each sample's success averaged over its runs) with a percentile bootstrap
    interval: the samples are drawn with replacement `resamples` times, and the interval holds the central
    `confidence` of the resampled means. Seeded, so a report is reproducible."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("an interval of no values")
    if x.size < 2:
        return Interval(float(x.mean()), math.nan, math.nan, 1, confidence)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)  # [resamples]
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return Interval(float(x.mean()), float(lo), float(hi), int(x.size), confidence)


def normal_quantile(q: float) -> float:
    """The q-quantile of the standard normal distribution (q in (0, 1)), by bisection on erf."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"normal_quantile takes q in (0, 1), got {q}")
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < q else (lo, mid)
    return (lo + hi) / 2


def wilson_interval(successes: float, n: int, confidence: float = 0.95) -> Interval:
    """A success rate over n episodes with the Wilson score interval. Unlike p ± z·stderr it does not
    collapse to a point at 0/n or n/n (0 of 8 is [0, 0.32], not [0, 0]), so an evaluation that saw no
    success still shows how little 8 episodes can tell."""
    if n <= 0:
        raise ValueError(f"a rate over {n} episodes")
    p = successes / n
    z = normal_quantile((1 + confidence) / 2)
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return Interval(p, max(0.0, centre - half), min(1.0, centre + half), n, confidence)


def status_rates(statuses: Iterable[str]) -> dict[str, float]:
    """Fraction of episodes that ended each way, over every episode (env errors and cancellations
    included), for every status in `STATUSES` (zeros kept, so tables have fixed columns).

    Raises:
        ValueError: a status that is not a final one (a typo, or `running`).
    """
    counts = dict.fromkeys(STATUSES, 0)
    n = 0
    for s in statuses:
        if s not in counts:
            raise ValueError(f"unknown episode status {s!r}")
        counts[s] += 1
        n += 1
    return {s: (c / n if n else 0.0) for s, c in counts.items()}
