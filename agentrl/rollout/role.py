"""The rollout role on a synchronous schedule.

    expert demonstrations (train split)  → shards/expert-0/000000.h5
    wait weights v0 → evaluate (test split, greedy) → report/eval-v0.json
    for each step N: GRPO groups (train split) with v<N> → shards/rollout-0/<N>.h5; wait v<N+1>; swap
    evaluate the final weights → report/eval-v<steps>.json, report/summary.json

Many agent loops run concurrently (asyncio) against the env gateway; env failures are retried a bounded
number of times and otherwise kept as `env_error` trajectories, which the trainer counts and skips.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.envs.api import EnvError
from agentrl.fsio import write_json_atomic
from agentrl.monitor.eval_summary import per_task_summary, task_eval
from agentrl.monitor.rollout_stats import rollout_metrics
from agentrl.monitor.trajectory_text import write_conversations
from agentrl.rollout.agent_loop import EpisodeLimits, run_episode
from agentrl.rollout.chat import ChatFormat
from agentrl.rollout.engine import Engine, ExpertEngine, SamplingConfig
from agentrl.rollout.engine_pool import EnginePool
from agentrl.transport import weights as weights_io
from agentrl.transport.shards import ShardWriter
from agentrl.types import Status, Trajectory, new_id

log = logging.getLogger("agentrl.rollout")


# Errors a retry cannot mend: the run is misconfigured, not unlucky.
FATAL_CODES = ("unauthorized", "forbidden", "unknown_task", "bad_request")


@dataclass(frozen=True)
class Retry:
    """How an episode that the infrastructure ended is tried again.

    `max_retries` more attempts after an env_error ending, each after `backoff_s` doubling up to `max_backoff_s`;
    while no worker has room (`no_capacity`, the controller unreachable) the episode waits with the same
    backoff up to `capacity_wait_s` without spending its retries: a restarting worker is given time."""

    max_retries: int = 2
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    capacity_wait_s: float = 120.0

    def delay(self, attempt: int) -> float:
        return min(self.backoff_s * 2 ** attempt, self.max_backoff_s) * random.uniform(0.5, 1.0)


@dataclass(frozen=True)
class Plan:
    tasks: tuple[str, ...]
    steps: int
    prompts_per_step: int
    samples_per_prompt: int
    expert_samples: int
    eval_split: str
    eval_samples: int
    concurrency: int
    temperature: float
    top_p: float
    limits: EpisodeLimits
    retry: Retry = Retry()
    wait_timeout_s: float = 3600.0
    seed: int = 0
    poll_s: float = 0.05
    eval_sampled: int = 0


async def collect(client: Any, engine: Engine, fmt: ChatFormat, requests: list[tuple[str, str, str]],
                  sampling: SamplingConfig, limits: EpisodeLimits, concurrency: int,
                  max_retries: int | Retry) -> tuple[list[Trajectory], int]:
    """Run one episode per (task, index, group_id), at most `concurrency` at once.

    Returns the trajectories (env_error ones included after the retries) and the number of retries.
    """
    retry = max_retries if isinstance(max_retries, Retry) else Retry(max_retries=max_retries)
    sem = asyncio.Semaphore(concurrency)
    retries = 0

    async def one(task: str, index: str, group: str) -> Trajectory:
        nonlocal retries
        attempt, waited, traj = 0, 0.0, None
        loop = asyncio.get_running_loop()
        while True:
            async with sem:
                try:
                    traj = await run_episode(client, engine, fmt, task, index, group, sampling, limits)
                except EnvError as e:  # could not even start a session
                    if e.code in FATAL_CODES:
                        raise
                    traj = None
                    if e.code == "no_capacity" and waited < retry.capacity_wait_s:
                        pause = retry.delay(min(attempt, 4))
                        log.warning("start_sample %s/%s: %s; waiting %.1fs for capacity", task, index, e, pause)
                        t0 = loop.time()
                        await asyncio.sleep(pause)
                        waited += loop.time() - t0
                        continue
                    log.warning("start_sample %s/%s failed (%s): attempt %d", task, index, e, attempt + 1)
            if traj is not None and traj.status != Status.ENV_ERROR:
                return traj
            if attempt >= retry.max_retries:
                break
            retries += 1
            await asyncio.sleep(retry.delay(attempt))
            attempt += 1
        if traj is None:  # keep a record: an empty env_error trajectory is counted, never trained on
            traj = Trajectory(new_id(), task, index, group, [], [], [], [], [], 0.0, Status.ENV_ERROR, 0,
                              metrics={"env_error": 1.0, "success": 0.0})
        return traj

    trajs = await asyncio.gather(*(one(*r) for r in requests))
    return list(trajs), retries


async def collect_step(client: Any, engine: Engine, fmt: ChatFormat, reqs: list[tuple[str, str, str]],
                       sampling: SamplingConfig, plan: Plan, step: int) -> tuple[list[Trajectory], int]:
    """One step's episodes. A batch in which the infrastructure ended every episode would be a step that
    trains on nothing: it is collected again (after a pause) until some episode ends on its own terms,
    for at most `plan.retry.capacity_wait_s`; then the run fails, saying the env workers are down."""
    retry = plan.retry
    deadline = time.monotonic() + retry.capacity_wait_s
    total_retries = 0
    for attempt in itertools.count():
        trajs, retries = await collect(client, engine, fmt, reqs, sampling, plan.limits, plan.concurrency, retry)
        total_retries += retries
        if any(not t.status.is_infra for t in trajs):
            return trajs, total_retries
        if time.monotonic() > deadline:
            break
        pause = retry.delay(min(attempt, 4))
        log.warning("step %d: every one of %d episodes ended in an env failure; collecting again in %.1fs",
                    step + 1, len(trajs), pause)
        await asyncio.sleep(pause)
    raise RuntimeError(f"step {step + 1}: every episode ended in an env failure for {retry.capacity_wait_s:g}s; "
                       "the env workers are down (see logs/env_worker-*.log and logs/controller.log)")


async def evaluate(client: Any, engine: Engine, fmt: ChatFormat, plan: Plan, version: int, report_dir: Path,
                   monitor, sampled: bool = False) -> tuple[dict[str, float], dict[str, dict[str, Any]]]:
    """Episodes on the first `eval_samples` held-out indices of each task: greedy, or (`sampled`) each
    index `eval_sampled` times at the rollout temperature, i.e. the stochastic policy RL optimizes.

    Returns the metrics (also logged and written to report/<eval|eval_sampled>-v<version>.json) and the
    per-task evaluation (`eval_summary.task_eval`: success, episodes, stderr, status counts)."""
    name, repeat = ("eval_sampled", plan.eval_sampled) if sampled else ("eval", 1)
    reqs = []
    for task in plan.tasks:
        idx = (await client.indices(task, plan.eval_split))[: plan.eval_samples]
        reqs += [(task, i, f"{name}-{task}-{i}") for i in idx for _ in range(repeat)]
    temperature, top_p = (plan.temperature, plan.top_p) if sampled else (0.0, 1.0)
    sampling = SamplingConfig(plan.limits.max_new_tokens, temperature, top_p, fmt.stop_ids)
    t0 = time.perf_counter()
    trajs, _ = await collect(client, engine, fmt, reqs, sampling, plan.limits, plan.concurrency, plan.retry)
    m = rollout_metrics(trajs, prefix=name)
    scored = [t for t in trajs if not t.status.is_infra]  # env failures say nothing about the policy
    m[f"{name}/success"] = sum(t.metrics.get("success", 0.0) for t in scored) / max(len(scored), 1)
    m[f"{name}/episodes"] = float(len(scored))
    m[f"{name}/env_errors"] = float(len(trajs) - len(scored))
    m[f"{name}/seconds"] = time.perf_counter() - t0
    per_task = task_eval(trajs)
    monitor.scalars(m, version)
    write_conversations(monitor, trajs, fmt.tokenizer, version, prefix=f"{name}/conversations")  # a few per task
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / f"{name}-v{version}.json").write_text(
        json.dumps({"version": version, **m, "per_task": per_task}, indent=2))
    log.info("%s v%d: success %.3f over %d held-out episodes (%s)", name, version, m[f"{name}/success"], len(trajs),
             "; ".join(f"{k} {v['success']:.3f}" for k, v in per_task.items()))
    return m, per_task


async def run(run_dir: Path, model_dir: Path, client: Any, fmt: ChatFormat, make_engine, plan: Plan, monitor) -> dict:
    rng = random.Random(plan.seed)
    limits = plan.limits
    sampling = SamplingConfig(limits.max_new_tokens, plan.temperature, plan.top_p, fmt.stop_ids)

    if plan.expert_samples > 0:
        reqs = []
        for task in plan.tasks:
            train = await client.indices(task, "train")
            reqs += [(task, i, f"expert-{task}-{i}") for i in rng.sample(train, min(plan.expert_samples, len(train)))]
        trajs, _ = await collect(client, ExpertEngine(client), fmt, reqs, sampling, limits,
                                 plan.concurrency, plan.retry)
        ShardWriter(run_dir / "shards" / "expert-0").write(trajs)
        m = rollout_metrics(trajs, prefix="expert")
        monitor.scalars(m, 0)
        log.info("expert: %d demonstrations, success %s", len(trajs),
                 {k: round(v, 3) for k, v in m.items() if k.endswith("/success")})

    path = await asyncio.to_thread(weights_io.wait_for, run_dir, 0, plan.wait_timeout_s, plan.poll_s)
    engine = make_engine()
    try:
        return await _rl_loop(run_dir, client, fmt, engine, path, plan, sampling, rng, monitor)
    finally:
        engine.close()


async def _rl_loop(run_dir: Path, client: Any, fmt: ChatFormat, engine: Any, path: Path, plan: Plan,
                   sampling: SamplingConfig, rng: random.Random, monitor) -> dict:
    await engine.load_weights(lambda: weights_io.iter_weights(path), 0)
    # Evaluation uses the newest weights only; RL episodes may route turns to a lagging pool (engine_pool).
    policy = engine.current if isinstance(engine, EnginePool) else engine
    report = run_dir / "report"
    before, task_before = await evaluate(client, policy, fmt, plan, 0, report, monitor)
    sampled_before = None
    if plan.eval_sampled:
        m, sampled_before = await evaluate(client, policy, fmt, plan, 0, report, monitor, sampled=True)
        before.update(m)

    writer = ShardWriter(run_dir / "shards" / "rollout-0")
    train_idx = {t: await client.indices(t, "train") for t in plan.tasks}
    for task, idx in train_idx.items():
        if len(idx) < plan.prompts_per_step:
            raise ValueError(f"rollout.prompts_per_step={plan.prompts_per_step} exceeds the {len(idx)} "
                             f"train samples of task {task!r}")
    for step in range(plan.steps):
        t0 = time.perf_counter()
        reqs = []
        for task in plan.tasks:
            for index in rng.sample(train_idx[task], plan.prompts_per_step):
                group = f"s{step}-{task}-{index}"
                reqs += [(task, index, group)] * plan.samples_per_prompt
        trajs, retries = await collect_step(client, engine, fmt, reqs, sampling, plan, step)
        writer.write(trajs)
        dt = time.perf_counter() - t0
        n_act = sum(t.num_action_tokens for t in trajs)
        m = rollout_metrics(trajs)
        m.update({"pipeline/rollout_tokens_per_s": n_act / dt, "pipeline/trajectories_per_s": len(trajs) / dt,
                  "env/retries": float(retries)})
        if isinstance(engine, EnginePool):
            m.update(engine.take_metrics())
        monitor.scalars(m, step)
        log.info("rollout step %d/%d: %d trajectories, reward %.3f, success %.3f, %.1f gen fmt/s", step + 1,
                 plan.steps, len(trajs), sum(t.reward for t in trajs) / len(trajs),
                 sum(t.metrics.get("success", 0.0) for t in trajs) / len(trajs), n_act / dt)
        path = await asyncio.to_thread(weights_io.wait_for, run_dir, step + 1, plan.wait_timeout_s, plan.poll_s)
        await engine.load_weights(lambda p=path: weights_io.iter_weights(p), step + 1)

    after, task_after = await evaluate(client, policy, fmt, plan, plan.steps, report, monitor)
    trainer_report = read_json(report / "trainer.json")
    summary: dict[str, Any] = {
        "success_before_rl": before["eval/success"], "success_after_rl": after["eval/success"],
        "eval_episodes": int(after["eval/episodes"]), "env_errors": int(after["eval/env_errors"]),
        "steps": plan.steps,
        # steps whose batch changed the weights (a step left with no usable trajectory is not counted)
        "rl_steps": int(trainer_report.get("rl_steps", plan.steps)), "trainer": trainer_report}
    sampled_after = None
    if plan.eval_sampled:
        m, sampled_after = await evaluate(client, policy, fmt, plan, plan.steps, report, monitor, sampled=True)
        after.update(m)
        summary.update({"sampled_success_before_rl": before["eval_sampled/success"],
                        "sampled_success_after_rl": after["eval_sampled/success"],
                        "sampled_eval_episodes": int(after["eval_sampled/episodes"])})
    summary["per_task"] = per_task_summary(task_before, task_after, sampled_before, sampled_after)
    if isinstance(engine, EnginePool) and engine.lagging:  # cross-policy sampling: turns and tokens by pool
        summary["lagging_pool"] = engine.totals.as_dict()
    write_json_atomic(report / "summary.json", summary, indent=2)
    if summary["eval_episodes"] == 0:  # every held-out episode was an env failure: no result to report
        raise RuntimeError(f"the final evaluation scored no episode ({summary['env_errors']} env errors): "
                           "the env workers failed; see logs/env_worker-*.log and logs/controller.log")
    return summary


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from `path`, or {} if it is missing or unreadable (a report another role may not have written)."""
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}
