"""agentrl.bench.trainer_head (what `jobs.bench_trainer_head` measures): the old whole-vocabulary step kept as the
baseline makes the same update as the tiled one, and each side reports its memory and time (the sizes themselves
are a benchmark's, not a test's)."""
from __future__ import annotations

import pytest

from agentrl.bench.trainer_head import HeadBench, measure


def test_both_sides_take_the_same_step_and_report_it() -> None:
    b = HeadBench(hidden=32, layers=1, vocab=700, tokens=256, trajectories=4, parallel="none")
    full, lean = measure("full", b), measure("lean", b)
    assert full["loss"] == pytest.approx(lean["loss"], rel=1e-5)
    assert full["grad_norm"] == pytest.approx(lean["grad_norm"], rel=1e-4) and lean["grad_norm"] > 0
    for r in (full, lean):
        assert r["tokens"] == 256 > r["action_tokens"] > 0 and r["step_s"] > 0 and r["finite"]
        assert r["peak_rss_gib"] >= 0.99 * r["rss_before_step_gib"] > 0  # the kernel updates its high-water lazily
