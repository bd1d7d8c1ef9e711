"""agentrl.bench.repeat: the interleaving order, the statistics (by hand) and the machine record, on fake sides."""
from __future__ import annotations

import argparse
import os

import pytest

from agentrl.bench.repeat import (
    MIN_REPEATS,
    Ratio,
    add_args,
    interleave,
    machine,
    order,
    pair_ratios,
    parse_cpus,
    pin,
    spread,
    summarize,
    table,
)


def test_order_alternates_the_sides_every_repeat() -> None:
    assert order(["A", "B"], 3) == [(0, "A"), (0, "B"), (1, "A"), (1, "B"), (2, "A"), (2, "B")]
    with pytest.raises(ValueError):
        order(["A", "A"], 3)
    with pytest.raises(ValueError):
        order(["A", "B"], 0)


def test_interleave_runs_sides_in_order_and_keeps_each_repeat() -> None:
    ran: list[str] = []

    def side(name: str, base: float):
        def run(i: int) -> dict[str, float]:
            ran.append(f"{name}{i}")
            return {"rate": base + i}
        return run

    samples = interleave({"A": side("A", 10.0), "B": side("B", 5.0)}, 3)
    assert ran == ["A0", "B0", "A1", "B1", "A2", "B2"]
    assert samples == {"A": [{"rate": 10.0}, {"rate": 11.0}, {"rate": 12.0}],
                       "B": [{"rate": 5.0}, {"rate": 6.0}, {"rate": 7.0}]}


def test_statistics_by_hand() -> None:
    assert spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert spread([4.0, 1.0, 2.0, 3.0])["median"] == 2.5
    # a machine that slows down: B is always half of A in the same repeat, while both halve over time
    samples = {"A": [{"r": 8.0}, {"r": 4.0}, {"r": 2.0}], "B": [{"r": 4.0}, {"r": 2.0}, {"r": 1.0}]}
    r = Ratio("a_over_b", "A", "r", "B", "r")
    assert pair_ratios(samples, r) == [2.0, 2.0, 2.0]  # the pairs divide the drift out
    s = summarize(samples, [r])
    assert s["sides"]["A"]["r"] == {"median": 4.0, "min": 2.0, "max": 8.0, "n": 3}
    assert s["ratios"]["a_over_b"]["median"] == 2.0 and s["ratios"]["a_over_b"]["max"] == 2.0
    # the ratio of medians would be the same here, but not in general: per-pair differs from median/median
    s2 = summarize({"A": [{"r": 1.0}, {"r": 10.0}, {"r": 3.0}], "B": [{"r": 1.0}, {"r": 2.0}, {"r": 6.0}]}, [r])
    assert s2["ratios"]["a_over_b"]["pairs"] == [1.0, 5.0, 0.5] and s2["ratios"]["a_over_b"]["median"] == 1.0
    text = table(s)
    assert "A.r" in text and "ratio a_over_b" in text and len(text.splitlines()) == 4
    assert pair_ratios({"A": [{"r": 1.0}], "B": [{"r": 0.0}]}, r) == [float("inf")]
    with pytest.raises(ValueError):
        pair_ratios({"A": [{"r": 1.0}], "B": []}, r)


def test_repeats_below_three_are_refused_and_cpus_parse() -> None:
    ap = argparse.ArgumentParser()
    add_args(ap)
    assert ap.parse_args([]).repeats == MIN_REPEATS == 3
    assert ap.parse_args(["--repeats", "5"]).repeats == 5
    with pytest.raises(SystemExit):
        ap.parse_args(["--repeats", "2"])
    assert parse_cpus("0-2,5") == [0, 1, 2, 5]
    assert parse_cpus("") == sorted(os.sched_getaffinity(0))


def test_pin_sets_the_same_env_and_the_record_says_where() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    try:
        env = pin(allowed[:1], vllm_bind="nobind")
        assert os.sched_getaffinity(0) == {allowed[0]}
        assert env == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
        rec = machine(7, allowed[:1], env, (0.5, 0.25, 0.125), argv=["-m", "jobs.bench_x", "--repeats", "3"])
    finally:
        os.sched_setaffinity(0, set(allowed))
    assert rec["affinity"] == allowed[:1] and rec["seed"] == 7 and rec["cpu_count"] == os.cpu_count()
    assert rec["command"][1:] == ["-m", "jobs.bench_x", "--repeats", "3"] and rec["load_avg_before"] == [0.5, 0.25, 0.12]
    assert len(rec["load_avg_after"]) == 3 and rec["cpu_model"] and rec["python"]
