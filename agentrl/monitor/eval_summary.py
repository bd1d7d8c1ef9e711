"""Held-out evaluation, summarized per task: success (greedy and sampled) over every episode, its standard
error, the env errors among them, and the mix of statuses the episodes ended with, so that a success of
0.000 explains itself.

Plain Python over `Trajectory` lists; the rollout role writes these into report/ and the summary line.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

from agentrl.monitor.rollout_stats import task_metric_means
from agentrl.types import Status, Trajectory


def task_eval(trajs: list[Trajectory]) -> dict[str, dict[str, Any]]:
    """Per task: `success` (mean of metrics["success"] over every episode, an env error counting as a failure,
    as `jobs.eval` scores: the key every summary uses), `episodes` (all of them), `stderr` (binomial standard
    error of success), `env_errors` and `env_error_rate` (episodes the infrastructure ended: env_error,
    cancelled), `status` (counts of every ending), `metrics` (the mean of every float the task reported, over
    the episodes the env finished: an env error reports none)."""
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        by_task[t.task].append(t)
    out: dict[str, dict[str, Any]] = {}
    for task, ts in sorted(by_task.items()):
        finished = [t for t in ts if not t.status.is_infra]
        n = len(ts)
        p = sum(t.metrics.get("success", 0.0) for t in ts) / n if n else 0.0
        out[task] = {"success": p, "episodes": n, "stderr": math.sqrt(p * (1 - p) / n) if n else 0.0,
                     "env_errors": n - len(finished), "env_error_rate": (n - len(finished)) / n if n else 0.0,
                     "status": dict(sorted(Counter(t.status.value for t in ts).items())),
                     "metrics": task_metric_means(finished)}
    return out


def per_task_summary(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]],
                     sampled_before: dict[str, dict[str, Any]] | None,
                     sampled_after: dict[str, dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """The `per_task` block of report/summary.json from the four evaluations (sampled ones may be None)."""
    out: dict[str, dict[str, Any]] = {}
    for task in sorted(set(before) | set(after)):
        b, a = before.get(task, {}), after.get(task, {})
        row: dict[str, Any] = {"success_before_rl": b.get("success", 0.0), "success_after_rl": a.get("success", 0.0),
                               "episodes": a.get("episodes", 0), "env_errors": a.get("env_errors", 0),
                               "status": {"before_rl": b.get("status", {}), "after_rl": a.get("status", {})}}
        if sampled_before is not None and sampled_after is not None:
            sb, sa = sampled_before.get(task, {}), sampled_after.get(task, {})
            gain = sa.get("success", 0.0) - sb.get("success", 0.0)
            row.update({"sampled_success_before_rl": sb.get("success", 0.0),
                        "sampled_success_after_rl": sa.get("success", 0.0),
                        "sampled_episodes": sa.get("episodes", 0),
                        "sampled_gain": gain,
                        "sampled_gain_stderr": math.hypot(sb.get("stderr", 0.0), sa.get("stderr", 0.0))})
            row["status"].update({"sampled_before_rl": sb.get("status", {}), "sampled_after_rl": sa.get("status", {})})
        out[task] = row
    return out


STATUS_ORDER = [s.value for s in Status if s != Status.RUNNING]


def status_mix(counts: dict[str, int]) -> str:
    """`completed 190, turn_limit 10` in a fixed order, zero counts left out."""
    return ", ".join(f"{k} {counts[k]}" for k in STATUS_ORDER if counts.get(k))


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """Human lines for the end of a run: one per task, then the totals."""
    lines = []
    for task, r in summary.get("per_task", {}).items():
        text = f"  {task}: greedy {r['success_before_rl']:.3f} -> {r['success_after_rl']:.3f}"
        if "sampled_success_before_rl" in r:
            text += (f", sampled {r['sampled_success_before_rl']:.3f} -> {r['sampled_success_after_rl']:.3f} "
                     f"(gain {r['sampled_gain']:+.3f} +/- {r['sampled_gain_stderr']:.3f})")
        st = r["status"]
        after = st.get("sampled_after_rl") or st.get("after_rl", {})
        text += f"; ended: {status_mix(after) or 'nothing'}"
        lines.append(text)
    return lines
