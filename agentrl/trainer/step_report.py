"""What the hub reports about each step (`trainer.role._loop`): its TensorBoard scalars (`train/*`, `pipeline/*`,
the queue's own), its log line, and the running totals in `TrainerState.stats` that report/trainer.json shows.

It only measures and writes down: the loop decides everything, and calls it at four points of a step:

    report.waiting()                       # before the wait for groups
    report.got(groups, version)            # the wait's end: fill (the first step) or idle time, staleness
    report.trained(usable, counts, stats, lr)   # after the update, before the step's report/trainer.json
    report.done(control)                   # after the step (version published): scalars and the log line
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

from agentrl.algorithms.staleness import trajectory_staleness
from agentrl.trainer.checkpoint import TrainerState
from agentrl.trainer.publisher import Publisher
from agentrl.transport.queue import TrajectoryQueue
from agentrl.types import Trajectory

log = logging.getLogger("agentrl.trainer")


class StepReport:
    """One per run, on the hub. Idle time counts from the first batch on: the wait for it (engines starting, the
    first episodes) is the pipeline's fill, kept apart as `fill_s`."""

    def __init__(self, state: TrainerState, q: TrajectoryQueue, publisher: Publisher, monitor: Any,
                 steps: int) -> None:
        self.state, self.q, self.publisher, self.monitor, self.steps = state, q, publisher, monitor, steps
        self.t_start: float | None = None
        self.idle_total = 0.0
        self.t_wait = self.t0 = 0.0
        self.groups: list[list[Trajectory]] = []
        self.stale: list[int] = []

    def waiting(self) -> None:
        self.t_wait = time.perf_counter()

    def got(self, groups: list[list[Trajectory]], version: int) -> None:
        """The step's groups are here: the wait was the fill or idle time; each trajectory's staleness at
        `version` (the one being trained on)."""
        self.t0 = time.perf_counter()
        if self.t_start is None:
            self.t_start = self.t0
            self.state.stats["fill_s"] = self.t0 - self.t_wait
        else:
            self.idle_total += self.t0 - self.t_wait
        self.groups = groups
        self.stale = [trajectory_staleness(t, version) for g in groups for t in g]

    def trained(self, usable: list[Trajectory], counts: dict[str, int], stats: dict[str, float], lr: float) -> None:
        """The update is done: the running totals, before the step's report/trainer.json is written."""
        self.usable, self.counts, self.stats, self.lr = usable, counts, stats, lr
        self.n_tok = sum(t.num_tokens for t in usable)
        totals = self.state.stats
        for k, v in {"trajectories_trained": len(usable), "tokens_trained": self.n_tok,
                     "rl_steps": float(bool(stats)), **counts}.items():
            if k != "staleness_max":
                totals[k] = totals.get(k, 0.0) + float(v)

    def done(self, control: bool) -> None:
        """The step is published: its scalars (at step index `state.step - 1`) and its log line."""
        state, q, counts, stats, stale = self.state, self.q, self.counts, self.stats, self.stale
        assert self.t_start is not None
        dt = time.perf_counter() - self.t0
        wall = time.perf_counter() - self.t_start
        wait = self.t0 - self.t_wait
        metrics = {f"train/{k}": v for k, v in stats.items()}
        metrics.update(q.metrics())
        metrics.update({"train/lr": self.lr, "pipeline/batch_size": float(len(self.usable)),
                        "pipeline/groups": float(len(self.groups)), "pipeline/trainer_wait_s": wait,
                        "pipeline/trainer_idle_frac": self.idle_total / max(wall, 1e-9),
                        "pipeline/staleness_mean": sum(stale) / max(len(stale), 1),
                        "pipeline/staleness_max": float(max(stale, default=0)),
                        "pipeline/train_tokens_per_s": self.n_tok / max(dt, 1e-9),
                        "pipeline/publish_wait_s": self.publisher.wait_s})
        metrics.update({f"pipeline/{k}": float(v) for k, v in counts.items() if k != "staleness_max"})
        for k, v in Counter(stale).items():
            metrics[f"pipeline/staleness_hist/{k}"] = float(v)
        state.stats["idle_s"] = self.idle_total
        state.stats["rl_wall_s"] = wall
        state.stats["staleness_sum"] = state.stats.get("staleness_sum", 0.0) + sum(stale)
        state.stats["staleness_max"] = max(state.stats.get("staleness_max", 0.0), float(max(stale, default=0)))
        self.monitor.scalars(metrics, state.step - 1)
        n = len(stale)
        if control:  # its rollout plays no training episode: no groups, no staleness, no queue to speak of
            log.info("step %d/%d imitated (the control run: warm-start loss %.4f; %.2fs)", state.step, self.steps,
                     stats.get("sft_loss", 0.0), dt)
            return
        did = f"trained on {len(self.usable)} of {n}"
        log.info("step %d/%d %s (%d groups, %d in uniform groups; staleness mean %.2f max %d; queue %d) loss %.6f "
                 "(%.2fs, waited %.2fs)", state.step, self.steps, did, len(self.groups), counts["dropped_uniform"],
                 metrics["pipeline/staleness_mean"], int(metrics["pipeline/staleness_max"]), q.depth,
                 stats.get("loss", 0.0), dt, wait)
