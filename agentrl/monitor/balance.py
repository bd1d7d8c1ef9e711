"""An asynchronous run's balance: how long its trainer waited, how long its rollout ranks were held at the
staleness bound, and so what limits it. Read by `jobs.bench_pipeline` (per side) and the run report."""
from __future__ import annotations

import statistics
from typing import Any


def async_figures(trainer: dict[str, Any], rollout: list[dict[str, Any]]) -> dict[str, float]:
    """An async run's balance, from its reports: how long the trainer waited (idle), how long one of its
    steps took (busy seconds per step), how long the staleness window held the rollout ranks' admission back
    (`window_bound_frac`: the bound, not the engine, kept episodes from starting) and the episodes in flight."""
    wall = max(trainer["rl_wall_s"], 1e-9)
    return {"trainer_idle_frac": trainer["idle_s"] / wall,
            "trainer_step_s": (wall - trainer["idle_s"]) / max(trainer["steps_done"], 1),
            "staleness_mean": trainer["staleness_sum"] / max(trainer["queue"].get("consumed", 0), 1),
            "staleness_max": float(trainer["staleness_max"]),
            "rollout_tokens_per_s": sum(x["action_tokens"] / max(x["wall_s"], 1e-9) for x in rollout),
            "rollout_idle_frac": statistics.mean(x["rollout_idle_frac"] for x in rollout),
            "window_bound_frac": statistics.mean(x.get("window_bound_frac", 0.0) for x in rollout),
            "in_flight_mean": sum(x.get("in_flight_mean", 0.0) for x in rollout)}


def pipeline_bound(trainer_idle_frac: float, window_bound_frac: float, in_flight_frac: float | None = None) -> str:
    """What limits an async run, read from its balance figures (`async_figures`):

    - "trainer": the trainer rarely waits (idle under 20 %): more trainer GPUs (or a cheaper step) pay;
    - "staleness window": the trainer waits and the rollout ranks spent at least half their time at the
      staleness bound with room for more episodes: more engines cannot help, a larger `algo.max_staleness`
      (or more trajectories per step) does;
    - "rollout concurrency": the trainer waits, the window is open, and the ranks keep their
      `rollout.concurrency` episodes in flight (`in_flight_frac`, episodes in flight over the ranks' caps,
      0.9 or more): that cap holds admission back; a higher one pays while the engines' batches have room;
    - "rollout": the trainer waits although admission was open: the engines (or the envs) are the bottleneck.
    """
    if trainer_idle_frac < 0.2:
        return "trainer"
    if window_bound_frac >= 0.5:
        return "staleness window"
    return "rollout concurrency" if in_flight_frac is not None and in_flight_frac >= 0.9 else "rollout"
