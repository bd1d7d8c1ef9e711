"""Per-task rollout statistics with the metric names of docs/architecture.md §9 (`rollout/<task>/...`)."""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from agentrl.types import Status, Trajectory


def task_metric_means(trajs: list[Trajectory]) -> dict[str, float]:
    """Mean of every numeric `metrics` key over the trajectories that report it (success included)."""
    sums: dict[str, list[float]] = defaultdict(list)
    for t in trajs:
        for k, v in t.metrics.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                sums[k].append(float(v))
    return {k: float(np.mean(v)) for k, v in sorted(sums.items())}


def rollout_metrics(trajs: list[Trajectory], prefix: str = "rollout") -> dict[str, float]:
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        by_task[t.task].append(t)
    out: dict[str, float] = {}
    for task, ts in sorted(by_task.items()):
        p = f"{prefix}/{task}"
        out[f"{p}/reward"] = float(np.mean([t.reward for t in ts]))
        out[f"{p}/success"] = float(np.mean([t.metrics.get("success", 0.0) for t in ts]))
        out[f"{p}/turns"] = float(np.mean([t.num_turns for t in ts]))
        out[f"{p}/tokens"] = float(np.mean([t.num_tokens for t in ts]))
        out[f"{p}/invalid_calls"] = float(np.mean([t.metrics.get("invalid_calls", 0.0) for t in ts]))
        # episodes whose tokens differ from the chat template's whole rendering (rollout.template_check)
        out[f"{p}/template_mismatch"] = float(sum(t.metrics.get("template_mismatch", 0.0) > 0 for t in ts))
        for key, value in task_metric_means(ts).items():  # every other float the task reports, e.g. read_note
            if key not in ("success", "invalid_calls", "template_mismatch"):
                out[f"{p}/metrics/{key}"] = value
        for s in Status:
            n = sum(t.status == s for t in ts)
            if n:
                out[f"{p}/status/{s.value}"] = n / len(ts)
    return out
