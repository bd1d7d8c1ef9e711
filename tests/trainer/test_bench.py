"""agentrl.bench.trainer_step (what `jobs.bench_trainer` measures) runs end to end on a toy size and reports its
numbers consistently (the speed itself is not tested)."""
from __future__ import annotations

import pytest

from agentrl.bench.trainer_step import StepBench, compare_steps


def test_bench_reports_both_rates_and_the_ratio() -> None:
    r = compare_steps(StepBench(hidden=64, layers=1, heads=1, vocab=128, trajectories=8, group=4, min_len=20,
                                max_len=60, micro_batch_tokens=120, steps=1, repeats=3, warmup=1))
    pairs = r["repeats"]["ratios"]["ours_over_bare"]["pairs"]
    assert len(pairs) == 3 and r["ratio"] == pytest.approx(sorted(pairs)[1])  # the median of the per-round ratios
    assert r["ours_tokens_per_s"] == pytest.approx(r["repeats"]["sides"]["ours"]["tokens_per_s"]["median"])
    assert len(r["ours_step_s"]) == len(r["bare_step_s"]) == 3 and min(r["ours_step_s"] + r["bare_step_s"]) > 0
    assert r["tokens_per_step"] > r["action_tokens_per_step"] > 0 and r["micro_batches"] >= 2
    assert 0 <= r["padding_frac"] <= r["padding_frac_padded_layout"] < 1
