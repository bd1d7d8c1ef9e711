"""`jobs.bench_pipeline`: its arithmetic (`agentrl.bench.pipeline`, fast), and one tiny invocation through the real
roles (slow)."""
from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.bench.pipeline import async_variants, best_splits, parse_splits, ratio_tag, throughput
from agentrl.monitor.balance import async_figures, pipeline_bound
from agentrl.rollout.env_latency import lognormal_delay

ROOT = Path(__file__).resolve().parents[2]


def test_latency_has_the_long_tail_it_claims() -> None:
    rng = random.Random(0)
    draws = sorted(lognormal_delay(0.1, 0.99, rng) for _ in range(20000))
    median, p99 = draws[len(draws) // 2], draws[int(0.99 * len(draws))]
    assert median == pytest.approx(0.1, rel=0.05)
    assert p99 / median == pytest.approx(10.0, rel=0.15)  # exp(2.326 · 0.99) = 10.0
    assert math.isclose(lognormal_delay(0.1, 0.0, rng), 0.1)


def test_throughput_counts_the_steady_state_and_the_whole_run() -> None:
    steady, e2e = throughput({1: 10.0, 2: 12.0, 3: 14.0, 4: 16.0}, t_v0=4.0, per_step=8)
    assert steady == pytest.approx(3 * 8 / 6.0)  # steps 2..4 over the time after step 1
    assert e2e == pytest.approx(4 * 8 / 12.0)  # all four from weights v0 on
    assert throughput({1: 10.0, 2: 12.0}, t_v0=None, per_step=8)[1] == pytest.approx(2 * 8 / 2.0)  # no v0: step 1


def test_async_sides_are_every_staleness_and_rank_pair_the_first_named_async() -> None:
    sides = async_variants("1,4", "1,2")
    assert sides == {"async": (1, 1, 1, 1), "async-s1-r2": (1, 2, 1, 1), "async-s4-r1": (4, 1, 1, 1),
                     "async-s4-r2": (4, 2, 1, 1)}
    assert [ratio_tag(n) for n in sides] == ["", "_s1_r2", "_s4_r1", "_s4_r2"]
    for bad in (("1,1", "1"), ("-1", "1"), ("1", "0")):
        with pytest.raises(ValueError):
            async_variants(*bad)


def test_thread_splits_are_sides_of_their_own_and_the_fastest_is_named() -> None:
    assert parse_splits("", (1, 1)) == [(1, 1)] and parse_splits("1:1,1:2", (9, 9)) == [(1, 1), (1, 2)]
    for bad in ("1:1,1:1", "0:2", "2", "a:b"):
        with pytest.raises(ValueError, match="--threads"):
            parse_splits(bad, (1, 1))
    sides = async_variants("8", "1,2", [(1, 1), (1, 2)])
    assert sides == {"async": (8, 1, 1, 1), "async-s8-r1-t1x2": (8, 1, 1, 2), "async-s8-r2-t1x1": (8, 2, 1, 1),
                     "async-s8-r2-t1x2": (8, 2, 1, 2)}
    assert ratio_tag("async-s8-r1-t1x2") == "_s8_r1_t1x2"
    rates = {"async": 18.2, "async-s8-r1-t1x2": 14.6, "async-s8-r2-t1x1": 11.0, "async-s8-r2-t1x2": 12.5}
    assert best_splits(sides, rates) == {
        "s8-r1": {"traj_per_s": {"1:1": 18.2, "1:2": 14.6}, "best": "1:1"},
        "s8-r2": {"traj_per_s": {"1:1": 11.0, "1:2": 12.5}, "best": "1:2"}}
    assert best_splits(async_variants("1,4", "1"), {"async": 1.0, "async-s4-r1": 2.0}) == {}  # one split: no choice


def test_async_figures_read_the_balance_from_the_reports() -> None:
    trainer = {"rl_wall_s": 20.0, "idle_s": 5.0, "steps_done": 10, "staleness_sum": 30.0, "staleness_max": 2,
               "queue": {"consumed": 40}}
    rollout = [{"action_tokens": 1000.0, "wall_s": 10.0, "rollout_idle_frac": 0.1, "window_bound_frac": 0.6,
                "in_flight_mean": 12.0},
               {"action_tokens": 3000.0, "wall_s": 20.0, "rollout_idle_frac": 0.3, "window_bound_frac": 0.2,
                "in_flight_mean": 4.0}]
    f = async_figures(trainer, rollout)
    assert f["trainer_idle_frac"] == pytest.approx(0.25) and f["trainer_step_s"] == pytest.approx(1.5)
    assert f["staleness_mean"] == pytest.approx(0.75) and f["staleness_max"] == 2.0
    assert f["rollout_tokens_per_s"] == pytest.approx(100.0 + 150.0)
    assert f["rollout_idle_frac"] == pytest.approx(0.2) and f["window_bound_frac"] == pytest.approx(0.4)
    assert f["in_flight_mean"] == pytest.approx(16.0)  # episodes in flight add up over the ranks


def test_the_bound_is_named_from_trainer_idle_and_the_window() -> None:
    assert pipeline_bound(0.1, 0.9) == "trainer"  # a busy trainer is the bottleneck, whatever the window
    assert pipeline_bound(0.76, 1.0) == "staleness window"  # the 2-core bench at max_staleness 1
    assert pipeline_bound(0.5, 0.1) == "rollout"  # waiting with admission open: engines or envs
    assert pipeline_bound(0.5, 0.1, 0.5) == "rollout"  # ... and room under the ranks' concurrency
    # the 2-core bench at max_staleness 8: 62 of 64 episodes in flight, the cap holds admission back
    assert pipeline_bound(0.23, 0.01, 62 / 64) == "rollout concurrency"
    assert pipeline_bound(0.1, 0.01, 62 / 64) == "trainer" and pipeline_bound(0.5, 0.8, 1.0) == "staleness window"


@pytest.mark.slow
@pytest.mark.e2e
def test_tiny_bench_writes_every_figure(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "jobs.bench_pipeline", "--steps", "2", "--prompts", "1",
                           "--latency", "0.1", "--loop-episodes", "16", "--repeats", "3", "--root", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads((tmp_path / "pipeline.json").read_text())
    for key in ("sync_traj_per_s", "async_traj_per_s", "async_over_sync", "trainer_idle_frac", "staleness_mean",
                "staleness_max", "rollout_over_raw_vllm"):
        assert isinstance(out[key], (int, float)) and out[key] >= 0, key
    assert out["sync_traj_per_s"] > 0 and out["async_traj_per_s"] > 0
    assert out["staleness_max"] <= 1 and 0 <= out["trainer_idle_frac"] <= 1
    # three repeats of each schedule, interleaved; the headline ratio is the median of the per-repeat ratios
    rep = out["repeats"]
    assert len(rep["samples"]["sync"]) == len(rep["samples"]["async"]) == 3
    pairs = [a["traj_per_s"] / s["traj_per_s"] for a, s in zip(rep["samples"]["async"], rep["samples"]["sync"])]
    assert out["async_over_sync"] == pytest.approx(sorted(pairs)[1], rel=0.01)
    assert rep["ratios"]["async_over_sync"]["min"] <= out["async_over_sync"] <= rep["ratios"]["async_over_sync"]["max"]
    assert len(out["agent_loop"]["repeats"]["ratios"]["agent_loop_over_raw"]["pairs"]) == 3
    assert out["machine"]["cpu_count"] >= 1 and out["machine"]["seed"] == 0 and out["machine"]["vllm"]
    # one sync side by default, its engine on every core
    assert list(out["sync_variants"]) == ["sync"]
    assert out["sync_variants"]["sync"]["engine_threads"] == len(out["setup"]["cpus"])
