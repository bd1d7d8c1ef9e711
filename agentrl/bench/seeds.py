"""The gates of `jobs.demo_seeds`: a run's sampled held-out success after RL against its own warm start, and
against a control run of its seed (the warm start continued for as many updates, no RL). A run is the dict
`jobs.demo_seeds` makes of one `jobs.train` run: name, seed, threads, control, wall_s, rc, sft_steps, and
per_task (the keys of report/summary.json's per_task), or `error` when the run failed.
"""
from __future__ import annotations

import math
from typing import Any


def gate(run: dict[str, Any], min_gain: float, min_sigmas: float) -> list[str]:
    """Reasons this run misses the gate (empty: it passes)."""
    if "error" in run:
        return [f"{run['name']}: the run failed (rc {run['rc']})"]
    misses = []
    for task, r in run["per_task"].items():
        gain, se = r["sampled_gain"], r["sampled_gain_stderr"]
        if gain is None:
            misses.append(f"{run['name']} {task}: no sampled evaluation")
        elif gain < min_gain or gain <= min_sigmas * se:
            misses.append(f"{run['name']} {task}: sampled gain {gain:+.3f} (se {se:.3f}) misses "
                          f">= {min_gain} and > {min_sigmas} se")
    return misses


def versus_control(run: dict[str, Any], control: dict[str, Any], min_sigmas: float) -> tuple[dict[str, Any], list[str]]:
    """Per task: RL's sampled success after the run minus the control's, its binomial standard error, and the
    misses (not more than `min_sigmas` standard errors above the control)."""
    out, misses = {}, []
    if "error" in run or "error" in control:
        return out, [f"{run['name']}: no comparison with {control['name']} (a run failed)"]
    for task, r in run["per_task"].items():
        c = control["per_task"].get(task)
        if c is None or r.get("sampled_episodes") is None:
            misses.append(f"{run['name']} {task}: no sampled evaluation to compare with the control")
            continue
        p, q = r["sampled_success_after_rl"], c["sampled_success_after_rl"]
        se = math.sqrt(p * (1 - p) / max(r["sampled_episodes"], 1) + q * (1 - q) / max(c["sampled_episodes"], 1))
        out[task] = {"diff": p - q, "se": se}
        if p - q <= min_sigmas * se:
            misses.append(f"{run['name']} {task}: after RL {p:.3f} vs control {q:.3f} ({p - q:+.3f}, se {se:.3f}) "
                          f"misses > {min_sigmas} se")
    return out, misses


def table(runs: list[dict[str, Any]]) -> str:
    lines = [f"{'run':<16} {'task':<8} {'greedy':>15} {'sampled':>15} {'gain':>7} {'se':>6} {'sft':>5} {'wall':>6}"]
    for run in runs:
        if "error" in run:
            lines.append(f"{run['name']:<16} FAILED rc {run['rc']}")
            continue
        for task, r in run["per_task"].items():
            lines.append(f"{run['name']:<16} {task:<8} {r['success_before_rl']:>6.3f} -> {r['success_after_rl']:.3f} "
                         f"{r['sampled_success_before_rl']:>6.3f} -> {r['sampled_success_after_rl']:.3f} "
                         f"{r['sampled_gain']:>+7.3f} {r['sampled_gain_stderr']:>6.3f} {run['sft_steps']!s:>5} "
                         f"{run['wall_s']:>5.0f}s" + (f"  vs control {v['diff']:+.3f} ± {v['se']:.3f}"
                                                      if (v := run.get("vs_control", {}).get(task)) else ""))
    return "\n".join(lines)


def mean_versus_control(vs: dict[str, dict[str, float]]) -> dict[str, float] | None:
    """The mean over tasks of RL − control and its standard error (the tasks' evaluations are independent:
    se = √(Σ seᵢ²) / n). None when no task was compared."""
    if not vs:
        return None
    n = len(vs)
    return {"diff": sum(v["diff"] for v in vs.values()) / n,
            "se": math.sqrt(sum(v["se"] ** 2 for v in vs.values())) / n, "tasks": n}


def mean_gate(run: dict[str, Any], min_sigmas: float) -> list[str]:
    """Misses of the multi-task bar against the control: the mean over tasks of RL − control must exceed
    `min_sigmas` standard errors (the paper's claim is about the task set, not each task alone)."""
    m = run.get("vs_control_mean")
    if m is None:
        return [f"{run['name']}: no mean over tasks against a control"]
    if m["diff"] <= min_sigmas * m["se"]:
        return [f"{run['name']} mean over {m['tasks']} tasks: RL − control {m['diff']:+.3f} (se {m['se']:.3f}) "
                f"misses > {min_sigmas} se"]
    return []


def drop_gate(run: dict[str, Any], max_drop_sigmas: float) -> list[str]:
    """Misses of 'training the families together costs none of them': no task's sampled success after RL is below
    its warm start's by more than `max_drop_sigmas` standard errors of the difference."""
    if "error" in run:
        return []  # `gate` reports the failed run
    misses = []
    for task, r in run["per_task"].items():
        gain, se = r.get("sampled_gain"), r.get("sampled_gain_stderr")
        if gain is not None and se is not None and gain < -max_drop_sigmas * se:
            misses.append(f"{run['name']} {task}: sampled success fell {gain:+.3f} (se {se:.3f}), more than "
                          f"{max_drop_sigmas} se below its warm start")
    return misses
