"""Simulated env latency with a long tail, for benchmarks of the pipeline (`rollout.env_latency_s`).

Real tool calls (a database query, a web page, a compiler) take a lognormal-ish time whose p99 is about ten
times the median; the demo tasks answer in microseconds. `SlowClient` wraps the env client and
sleeps a lognormal time before every env call that an env would spend time on (start and each tool call),
so both schedules see the same distribution. Only the rollout's wrapper sleeps: workers and the
controller are untouched, and nothing here is used unless the option is set.
"""
from __future__ import annotations

import asyncio
import math
import random
from typing import Any


def lognormal_delay(median_s: float, sigma: float, rng: random.Random) -> float:
    """A draw with median `median_s`: p99 = median · exp(2.326 σ)."""
    return median_s * math.exp(sigma * rng.gauss(0.0, 1.0))


class SlowClient:
    """The env client, with a lognormal pause before `start_sample` and `interact`; all else passes through."""

    def __init__(self, client: Any, median_s: float, sigma: float, seed: int = 0) -> None:
        self._client, self.median_s, self.sigma = client, median_s, sigma
        self._rng = random.Random(seed)
        self.slept_s = 0.0

    async def _pause(self) -> None:
        d = lognormal_delay(self.median_s, self.sigma, self._rng)
        self.slept_s += d
        await asyncio.sleep(d)

    async def start_sample(self, *args: Any, **kwargs: Any) -> Any:
        await self._pause()
        return await self._client.start_sample(*args, **kwargs)

    async def interact(self, *args: Any, **kwargs: Any) -> Any:
        await self._pause()
        return await self._client.interact(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def maybe_slow(client: Any, median_s: float, sigma: float, seed: int = 0) -> Any:
    return SlowClient(client, median_s, sigma, seed) if median_s > 0 else client
