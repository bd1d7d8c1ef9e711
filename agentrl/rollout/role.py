"""The rollout role (docs/architecture.md §6, docs/pipeline.md): one of `cluster.rollout.ranks` that keep `concurrency`
episodes running and never wait for the trainer, except at the staleness bound. On the synchronous schedule
(max_staleness 0, one rank) that bound is every step: the rank samples one step's groups, then waits.

    rank 0: expert demonstrations → shards/expert-0 (the warm start); evaluation of v0 and of the final weights
    every rank: loop until the trainer says stop
        notices → newest weights → swap between generation calls (in-flight; or abort / drain, `inflight`)
        admission: start a group while started ≤ (max_staleness + version + 1) · groups per step of this rank
        finished trajectories → shards/rollout-<rank>/<seq>.h5 (durable first) → MPI to the trainer

Every action token keeps the version (and engine id) that sampled it, so a trajectory whose episode spans a
swap carries two versions, and staleness is exact per trajectory. With a lagging pool (cross-policy sampling,
`engine_pool`) each turn may also come from an engine up to K − 1 versions behind; evaluation always uses
the current engines.

A restarted rank (the MPI world restarted by the launcher, the rank alone in file mode while the trainer runs
on, or `python -m jobs.train` on an existing run dir) resumes: rank 0 keeps the expert demonstrations and the
before-RL evaluation already written, the weights come from the trainer's notice (the version it resumed at),
shard numbering goes on, and group ids carry the rank's incarnation (`shards/rollout-<rank>/incarnation`), so
no group of an earlier life is ever mixed with a new one. Episodes are played by `rollout.collect`, the
in-run evaluation by `rollout.in_run_eval`.
"""
from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.algorithms.staleness import admit_limit
from agentrl.config import RunConfig
from agentrl.fsio import write_json_atomic
from agentrl.monitor.eval_summary import per_task_summary
from agentrl.monitor.progress import StepProgress
from agentrl.monitor.rollout_stats import rollout_metrics
from agentrl.rollout.chat import ChatFormat
from agentrl.rollout.collect import collect
from agentrl.rollout.engine import ExpertEngine, SamplingConfig
from agentrl.rollout.engine_pool import EnginePool
from agentrl.rollout.in_run_eval import evaluate, read_json
from agentrl.rollout.spec import RolloutSpec
from agentrl.rollout.weight_sources import WeightSource
from agentrl.transport.channel import RolloutChannel
from agentrl.transport.shards import ShardReader, ShardWriter, shard_dir
from agentrl.types import Trajectory

log = logging.getLogger("agentrl.rollout")


@dataclass(frozen=True)
class RankPlace:
    """One rollout rank's place and bounds (what every rank plays is the `RolloutSpec`)."""

    rank: int
    ranks: int
    max_staleness: int
    inflight: str = "swap"  # swap | abort | drain
    evaluate: bool = True  # rank 0 evaluates v0 and the final weights and writes report/summary.json

    @classmethod
    def from_config(cls, cfg: RunConfig, rank: int) -> RankPlace:
        shape = cfg.pipeline  # the synchronous schedule's bounds are fixed there
        return cls(rank, cfg.cluster.rollout.ranks, shape.max_staleness, shape.inflight)

    def groups_per_step(self, spec: RolloutSpec) -> int:
        """This rank's share of one synchronous step's groups (groups_per_task × tasks over the ranks)."""
        total = spec.rollout.groups_per_task * len(spec.tasks)
        return total // self.ranks + (self.rank < total % self.ranks)


BEFORE_FILE = "before_rl.json"  # report/: rank 0's evaluation of the first weights, reused by a restarted rank


def next_incarnation(directory: Path) -> int:
    """How many times this rank started before in this run (0 the first time), counted in `directory`."""
    path = directory / "incarnation"
    n = int(path.read_text()) + 1 if path.exists() else 0
    directory.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(n))
    tmp.replace(path)
    return n


async def expert_demos(run_dir: Path, client: Any, fmt: ChatFormat, spec: RolloutSpec, monitor) -> None:
    """The scripted expert's train-split episodes for the warm start (shards/expert-0).
    Written once per run: a restarted rank finds them and moves on."""
    if ShardReader(run_dir / "shards" / "expert-0").available():
        log.info("expert: demonstrations already written (a resumed run)")
        return
    rng = random.Random(spec.seed)
    r = spec.rollout
    sampling = SamplingConfig(spec.limits.max_new_tokens, r.temperature, r.top_p, fmt.stop_ids)
    reqs = []
    for task in spec.tasks:
        train = await client.indices(task, "train")
        reqs += [(task, i, f"expert-{task}-{i}") for i in rng.sample(train, min(r.expert_samples, len(train)))]
    bar = StepProgress(len(reqs), "expert demonstrations")
    try:
        trajs, _ = await collect(client, ExpertEngine(client), fmt, reqs, sampling, spec.limits,
                                 r.concurrency, spec.retry, on_done=lambda t: bar.update(1, last=t.task))
    finally:
        bar.close()
    ShardWriter(run_dir / "shards" / "expert-0").write(trajs)
    monitor.scalars(rollout_metrics(trajs, prefix="expert"), 0)
    log.info("expert: %d demonstrations", len(trajs))


class RolloutLoop:
    """One rank's episodes: admission, weight swaps, and the path of each finished trajectory."""

    def __init__(self, run_dir: Path, client: Any, fmt: ChatFormat, engine: Any, spec: RolloutSpec, place: RankPlace,
                 channel: RolloutChannel, weights: WeightSource, monitor) -> None:
        self.client, self.fmt, self.engine, self.spec, self.place = client, fmt, engine, spec, place
        self.ch, self.weights, self.monitor = channel, weights, monitor
        self.sampling = SamplingConfig(spec.limits.max_new_tokens, spec.rollout.temperature, spec.rollout.top_p,
                                       fmt.stop_ids)
        self.writer = ShardWriter(shard_dir(run_dir, "rollout", place.rank))
        self.incarnation = next_incarnation(shard_dir(run_dir, "rollout", place.rank))
        self.base_version = engine.version  # the version this life of the rank started on
        self.rng = random.Random((spec.seed * 1000 + place.rank) * 1000 + self.incarnation)
        self.per_step = place.groups_per_step(spec)
        if self.per_step < 1:  # it would never start an episode
            total = spec.rollout.groups_per_task * len(spec.tasks)
            raise ValueError(f"cluster.rollout.ranks={place.ranks} exceeds the {total} groups of a step"
                             f" (groups_per_task x tasks): rank {place.rank} would have nothing to do")
        self.running: dict[asyncio.Task[Trajectory], tuple[str, str, str]] = {}
        self.finished: list[Trajectory] = []
        self.window: list[Trajectory] = []
        self.window_t0 = time.perf_counter()
        self.started_groups = 0
        self.stats = {"trajectories": 0.0, "aborted": 0.0, "cancelled_at_end": 0.0, "idle_s": 0.0,
                      "send_wait_s": 0.0, "swaps": 0.0, "action_tokens": 0.0, "window_bound_s": 0.0, "episode_s": 0.0}
        self._swap: asyncio.Task[None] | None = None

    def _admit_limit(self) -> int:
        """Groups this rank may have started: AReaL's bound, with the version that will sample them (counted
        from the version this life of the rank began on)."""
        return admit_limit(self.place.max_staleness, self.engine.version, self.base_version, self.per_step)

    def _has_room(self) -> bool:
        """Another group fits under `concurrency`."""
        return len(self.running) + self.spec.rollout.group_size <= self.spec.rollout.concurrency

    def _start_group(self, train_idx: dict[str, list[str]]) -> None:
        k = self.started_groups
        task = self.spec.tasks[k % len(self.spec.tasks)]
        index = self.rng.choice(train_idx[task])
        group = f"r{self.place.rank}i{self.incarnation}-g{k}-{task}-{index}"
        for _ in range(self.spec.rollout.group_size):
            self._start_episode((task, index, group))
        self.started_groups += 1

    def _start_episode(self, req: tuple[str, str, str]) -> None:
        task = asyncio.create_task(self._episode(req))
        self.running[task] = req

    async def _episode(self, req: tuple[str, str, str]) -> Trajectory:
        trajs, _ = await collect(self.client, self.engine, self.fmt, [req], self.sampling, self.spec.limits,
                                      1, self.spec.retry)
        return trajs[0]

    def _reap(self) -> None:
        for t in [t for t in self.running if t.done()]:
            self.running.pop(t)
            if not t.cancelled():
                self.finished.append(t.result())  # an episode's own exception (fatal env code) surfaces here

    def _flush(self) -> None:
        """Durable first (a shard segment), then over MPI."""
        if not self.finished:
            return
        batch, self.finished = self.finished, []
        self.writer.write(batch)
        self.stats["send_wait_s"] += self.ch.send(batch)
        self.window += batch
        self.stats["trajectories"] += len(batch)
        self.stats["action_tokens"] += sum(t.num_action_tokens for t in batch)

    def _log_window(self, version: int) -> None:
        """Per-task rollout metrics once, for the trajectories finished while `version` was sampling."""
        if not self.window:
            return
        dt = max(time.perf_counter() - self.window_t0, 1e-9)
        m = rollout_metrics(self.window)
        elapsed = max(time.perf_counter() - self.t_start, 1e-9)
        m.update({"pipeline/trajectories_per_s": len(self.window) / dt,
                  "pipeline/rollout_tokens_per_s": sum(t.num_action_tokens for t in self.window) / dt,
                  "pipeline/rollout_idle_frac": self.stats["idle_s"] / elapsed,
                  "pipeline/rollout_window_bound_frac": self.stats["window_bound_s"] / elapsed,
                  "pipeline/episodes_running": float(len(self.running)),
                  "rollout/aborted_episodes": self.stats["aborted"]})
        if isinstance(self.engine, EnginePool):  # turns and tokens by pool, the lagging pool's lag
            m.update(self.engine.take_metrics())
        self.monitor.scalars(m, version)
        self.window, self.window_t0 = [], time.perf_counter()

    async def _maybe_swap(self) -> None:
        """Take the newest complete weights, by the configured in-flight policy."""
        if self._swap is not None:
            if not self._swap.done():
                return
            self._swap.result()
            self._swap = None
        newest = self.weights.newest(self.ch.version)
        if newest is None or newest[0] <= self.engine.version:
            return
        if self.place.inflight == "drain" and self.running:
            return  # no admission meanwhile (see `run`): the running episodes finish on their weights
        if self.place.inflight == "abort" and self.running:
            reqs = list(self.running.values())
            for t in list(self.running):
                t.cancel()
            await asyncio.gather(*self.running, return_exceptions=True)
            self.running.clear()
            self.stats["aborted"] += len(reqs)
            for req in reqs:  # again, on the new weights (once the swap below is done: it is queued first)
                self._start_episode(req)
        old = self.engine.version
        version, loader = newest
        self._log_window(old)
        self.stats["swaps"] += 1
        self._swap = asyncio.create_task(self.engine.load_weights(loader, version))
        log.info("rank %d: weights v%d -> v%d with %d episodes in flight", self.place.rank, old, version,
                 len(self.running))

    def _swap_pending(self) -> bool:
        newest = self.weights.newest(self.ch.version)
        return self._swap is not None or (newest is not None and newest[0] > self.engine.version)

    async def run(self, train_idx: dict[str, list[str]], poll_s: float) -> None:
        self.t_start = time.perf_counter()
        last = time.perf_counter()
        while True:
            self.ch.poll_notices()
            if self.ch.stopped:
                break
            if self.spec.train:  # a control run's ranks play nothing until the stop: no weights to take either
                await self._maybe_swap()
            hold = self.place.inflight == "drain" and self._swap_pending()
            while self.spec.train and not hold and self.started_groups < self._admit_limit() and self._has_room():
                self._start_group(train_idx)
            self._reap()
            self._flush()
            # over the poll that follows, admission is held back by the staleness window alone: room under
            # `concurrency`, but `_admit_limit` reached
            window_full = not hold and self.started_groups >= self._admit_limit() and self._has_room()
            in_flight = len(self.running)
            await asyncio.sleep(poll_s)
            now = time.perf_counter()
            if not self.running:
                self.stats["idle_s"] += now - last
            if window_full:
                self.stats["window_bound_s"] += now - last
            self.stats["episode_s"] += in_flight * (now - last)
            last = now
        for t in self.running:  # the trainer has what it needs: episodes still running are not trajectories
            t.cancel()
        await asyncio.gather(*self.running, return_exceptions=True)
        self.stats["cancelled_at_end"] = float(sum(t.cancelled() for t in self.running))
        self._reap()
        self._flush()
        self._log_window(self.engine.version)
        self.stats["wall_s"] = time.perf_counter() - self.t_start
        wall = max(self.stats["wall_s"], 1e-9)
        self.stats["rollout_idle_frac"] = self.stats["idle_s"] / wall
        self.stats["window_bound_frac"] = self.stats["window_bound_s"] / wall
        self.stats["in_flight_mean"] = self.stats["episode_s"] / wall


async def run(run_dir: Path, client: Any, fmt: ChatFormat, make_engine: Callable[[], Any], spec: RolloutSpec,
              place: RankPlace, monitor, channel_factory: Callable[[], RolloutChannel],
              weights_factory: Callable[[RolloutChannel], WeightSource]) -> dict[str, Any]:
    """One rollout rank, start to stop. Returns this rank's statistics (rank 0: with the summary)."""
    if place.rank == 0 and spec.demonstrations:
        await expert_demos(run_dir, client, fmt, spec, monitor)
    ch = await asyncio.to_thread(channel_factory)  # waits through the trainer's warm start
    weights = weights_factory(ch)
    first = await asyncio.to_thread(weights.wait, ch.version, spec.wait_timeout_s)
    engine = make_engine()
    policy = engine.policy if isinstance(engine, EnginePool) else engine  # evaluation: the newest weights only
    try:
        await engine.load_weights(first[1], first[0])
        report = run_dir / "report"
        evaluating = place.evaluate and place.rank == 0
        if evaluating:
            before, task_before, sampled_before = await _before_rl(client, policy, fmt, spec, report, monitor)
        train_idx = {t: await client.indices(t, "train") for t in spec.tasks}
        pipe = RolloutLoop(run_dir, client, fmt, engine, spec, place, ch, weights, monitor)
        await pipe.run(train_idx, min(spec.poll_s, 0.02))
        ch.close(timeout_s=spec.wait_timeout_s)
        out: dict[str, Any] = {"rank": place.rank, **pipe.stats}
        if isinstance(engine, EnginePool) and engine.lagging:
            out.update(engine.totals.as_dict())
        report.mkdir(parents=True, exist_ok=True)
        write_json_atomic(report / f"rollout-{place.rank}.json", out, indent=2)
        log.info("rank %d stopped: %s", place.rank, json.dumps({k: round(v, 3) for k, v in pipe.stats.items()}))
        trainer_report = read_json(report / "trainer.json")
        if evaluating and trainer_report.get("steps_done", 0) < trainer_report.get("steps", 0):
            # a preempted trainer (Slurm's warning): the job must requeue before its time runs out, and the
            # resumed run evaluates its own final weights
            log.info("the trainer stopped at step %d of %d: no final evaluation", trainer_report["steps_done"],
                     trainer_report["steps"])
            evaluating = False
        if evaluating:
            final = await asyncio.to_thread(weights.wait, ch.version, spec.wait_timeout_s)
            if final[0] > policy.version:
                await policy.load_weights(final[1], final[0])
            out["summary"] = await _final_report(client, policy, fmt, spec, report, monitor, before, task_before,
                                                 sampled_before)
        return out
    finally:
        weights.close()
        engine.close()


async def _before_rl(client: Any, engine: Any, fmt: ChatFormat, spec: RolloutSpec, report: Path, monitor
                     ) -> tuple[dict[str, float], dict[str, Any], Any]:
    """Evaluate the first weights (greedy, and sampled if configured), once per run: a restarted rank 0 reads
    what its earlier life measured (the weights it would evaluate now are already trained)."""
    path = report / BEFORE_FILE
    if path.exists():
        saved = json.loads(path.read_text())
        log.info("before-RL evaluation of v%d read from %s (a resumed run)", saved["version"], path)
        return saved["before"], saved["task_before"], saved["sampled_before"]
    before, task_before = await evaluate(client, engine, fmt, spec, engine.version, report, monitor)
    sampled_before = None
    if spec.rollout.eval_sampled:
        m, sampled_before = await evaluate(client, engine, fmt, spec, engine.version, report, monitor,
                                                sampled=True)
        before.update(m)
    write_json_atomic(path, {"version": engine.version, "before": before, "task_before": task_before,
                             "sampled_before": sampled_before})
    return before, task_before, sampled_before


async def _final_report(client: Any, engine: Any, fmt: ChatFormat, spec: RolloutSpec, report: Path, monitor,
                        before: dict[str, float], task_before: dict[str, Any], sampled_before: Any) -> dict[str, Any]:
    """Evaluate the final weights and write report/summary.json."""
    version = engine.version
    after, task_after = await evaluate(client, engine, fmt, spec, version, report, monitor)
    trainer_report = read_json(report / "trainer.json")
    summary: dict[str, Any] = {
        "schedule": trainer_report.get("schedule", "async"), "success_before_rl": before["eval/success"],
        "success_after_rl": after["eval/success"],
        "eval_episodes": int(after["eval/episodes"]), "env_errors": int(after["eval/env_errors"]),
        "steps": int(trainer_report.get("steps", version)), "final_version": version,
        "rl_steps": int(trainer_report.get("rl_steps", version)), "trainer": trainer_report}
    sampled_after = None
    if spec.rollout.eval_sampled:
        m, sampled_after = await evaluate(client, engine, fmt, spec, version, report, monitor, sampled=True)
        after.update(m)
        summary.update({"sampled_success_before_rl": before["eval_sampled/success"],
                        "sampled_success_after_rl": after["eval_sampled/success"],
                        "sampled_eval_episodes": int(after["eval_sampled/episodes"])})
    summary["per_task"] = per_task_summary(task_before, task_after, sampled_before, sampled_after)
    write_json_atomic(report / "summary.json", summary, indent=2)
    if summary["eval_episodes"] == summary["env_errors"]:  # none, or every one an env error
        raise RuntimeError("the final evaluation scored no episode: the env workers failed")
    return summary
