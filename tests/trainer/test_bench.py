"""agentrl.bench.trainer_step (what `jobs.bench_trainer` measures) runs end to end on a toy size and reports its
numbers consistently (the speed itself is not tested)."""
from __future__ import annotations

import pytest

from agentrl.bench.trainer_step import StepBench, compare_steps


def test_bench_reports_both_rates_and_the_ratio() -> None:
    r = compare_steps(StepBench(hidden=64, layers=1, heads=1, vocab=128, trajectories=8, group=4, min_len=20,
                                max_len=60, micro_batch_tokens=120, steps=2, warmup=1))
    assert r["ratio"] == pytest.approx(r["ours_tokens_per_s"] / r["bare_tokens_per_s"])
    assert len(r["ours_step_s"]) == len(r["bare_step_s"]) == 2 and min(r["ours_step_s"] + r["bare_step_s"]) > 0
    assert r["tokens_per_step"] > r["action_tokens_per_step"] > 0 and r["micro_batches"] >= 2
    assert 0 <= r["padding_frac"] <= r["padding_frac_padded_layout"] < 1
