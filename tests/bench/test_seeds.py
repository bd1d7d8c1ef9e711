"""The gates `jobs.demo_seeds` applies: RL's gain over the warm start, and RL against its seed's control."""
from __future__ import annotations

import math

from agentrl.bench.seeds import drop_gate, gate, mean_gate, mean_versus_control, table, versus_control


def _run(name: str, before: float, after: float, episodes: int = 256, control: bool = False) -> dict:
    se = math.hypot(math.sqrt(before * (1 - before) / episodes), math.sqrt(after * (1 - after) / episodes))
    return {"name": name, "seed": 0, "threads": 2, "control": control, "wall_s": 60.0, "rc": 0, "sft_steps": 4,
            "per_task": {"lookup": {"success_before_rl": before, "success_after_rl": after,
                                    "sampled_success_before_rl": before, "sampled_success_after_rl": after,
                                    "sampled_gain": after - before, "sampled_gain_stderr": se,
                                    "sampled_episodes": episodes}}}


def test_gain_gate_needs_both_the_absolute_gain_and_the_sigmas() -> None:
    assert gate(_run("a", 0.40, 0.60), min_gain=0.10, min_sigmas=3) == []  # +0.20, se 0.043: 4.6 se
    assert gate(_run("b", 0.40, 0.48), min_gain=0.0, min_sigmas=3)  # +0.08 is 1.8 se
    assert gate(_run("c", 0.40, 0.60), min_gain=0.25, min_sigmas=0)  # under the absolute bar
    assert gate({"name": "d", "rc": 1, "error": "boom"}, 0.0, 0.0) == ["d: the run failed (rc 1)"]


def test_versus_control_is_the_binomial_difference_of_the_two_evaluations_after() -> None:
    rl, ctl = _run("s0-t2", 0.40, 0.70), _run("s0-t2-control", 0.40, 0.45, episodes=64, control=True)
    out, misses = versus_control(rl, ctl, min_sigmas=3)
    se = math.sqrt(0.7 * 0.3 / 256 + 0.45 * 0.55 / 64)
    assert math.isclose(out["lookup"]["diff"], 0.25) and math.isclose(out["lookup"]["se"], se)
    assert misses == []  # 0.25 > 3 × 0.0685
    out, misses = versus_control(rl, _run("c", 0.40, 0.62, control=True), min_sigmas=3)
    assert len(misses) == 1 and "misses > 3" in misses[0]
    _, misses = versus_control(rl, {"name": "c", "rc": 1, "error": "x"}, 3)
    assert misses == ["s0-t2: no comparison with c (a run failed)"]
    rl["vs_control"] = out
    text = table([rl, ctl | {"error": "x"}])
    assert "vs control +0.080" in text and "s0-t2-control    FAILED rc 0" in text


def _tasks(name: str, pairs: dict[str, tuple[float, float]], episodes: int = 64, control: bool = False) -> dict:
    run = _run(name, 0.5, 0.5, episodes, control)
    run["per_task"] = {t: _run(name, b, a, episodes)["per_task"]["lookup"] for t, (b, a) in pairs.items()}
    return run


def test_the_mean_over_tasks_against_the_control_pools_the_tasks_standard_errors() -> None:
    rl = _tasks("s0-t2", {"db": (0.2, 0.5), "os": (0.1, 0.2), "kg": (0.3, 0.3)})
    ctl = _tasks("s0-t2-control", {"db": (0.2, 0.3), "os": (0.1, 0.1), "kg": (0.3, 0.3)}, control=True)
    vs, _ = versus_control(rl, ctl, min_sigmas=3)
    m = mean_versus_control(vs)
    naive_se = math.sqrt(sum(v["se"] ** 2 for v in vs.values())) / 3
    assert math.isclose(m["diff"], (0.2 + 0.1 + 0.0) / 3) and math.isclose(m["se"], naive_se) and m["tasks"] == 3
    rl["vs_control_mean"] = m
    assert mean_gate(rl, min_sigmas=1) == []  # +0.100 against se ~0.044
    assert mean_gate(rl, min_sigmas=3)  # 2.3 se: missed
    assert mean_gate({"name": "x"}, 3) == ["x: no mean over tasks against a control"]
    assert mean_versus_control({}) is None


def test_the_drop_gate_flags_a_task_that_ends_below_its_warm_start() -> None:
    run = _tasks("s0-t2", {"db": (0.2, 0.6), "os": (0.5, 0.3), "kg": (0.3, 0.27)})
    misses = drop_gate(run, max_drop_sigmas=2)
    assert len(misses) == 1 and "s0-t2 os" in misses[0]  # -0.20 is 2.3 se; kg's -0.03 is 0.4 se
    assert drop_gate({"name": "y", "rc": 1, "error": "boom"}, 2) == []
