"""The evaluation inside a training run: held-out episodes of each task, greedy (and optionally sampled), by
rollout rank 0 on the first weights and on the final ones (report/eval-v<N>.json, TensorBoard)."""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from agentrl.monitor.eval_summary import task_eval
from agentrl.monitor.rollout_stats import rollout_metrics
from agentrl.monitor.trajectory_text import write_conversations
from agentrl.rollout.chat import ChatFormat
from agentrl.rollout.collect import collect
from agentrl.rollout.engine import Engine, SamplingConfig
from agentrl.rollout.spec import RolloutSpec

log = logging.getLogger("agentrl.rollout")


async def evaluate(client: Any, engine: Engine, fmt: ChatFormat, spec: RolloutSpec, version: int, report_dir: Path,
                   monitor, sampled: bool = False) -> tuple[dict[str, float], dict[str, dict[str, Any]]]:
    """Episodes on the first `eval_samples` held-out indices of each task: greedy, or (`sampled`) each
    index `eval_sampled` times at the rollout temperature, i.e. the stochastic policy RL optimizes.

    Returns the metrics (also logged and written to report/<eval|eval_sampled>-v<version>.json) and the
    per-task evaluation (`eval_summary.task_eval`: success, episodes, stderr, env errors, status counts).
    Success is over every episode, an env error (after the rollout's retries) counting as a failure, as in
    `jobs.eval`; `<name>/env_errors` and `<name>/env_error_rate` say how many there were."""
    r = spec.rollout
    name, repeat = ("eval_sampled", r.eval_sampled) if sampled else ("eval", 1)
    reqs = []
    for task in spec.tasks:
        idx = (await client.indices(task, r.eval_split))[: r.eval_samples]
        reqs += [(task, i, f"{name}-{task}-{i}") for i in idx for _ in range(repeat)]
    temperature, top_p = (r.temperature, r.top_p) if sampled else (0.0, 1.0)
    sampling = SamplingConfig(spec.limits.max_new_tokens, temperature, top_p, fmt.stop_ids)
    t0 = time.perf_counter()
    trajs, _ = await collect(client, engine, fmt, reqs, sampling, spec.limits, r.concurrency, spec.retry)
    m = rollout_metrics(trajs, prefix=name)
    # as jobs.eval scores: `collect` has retried env errors; those left are failures in the success rate
    # (never left out of its denominator) and are reported beside it as their own count and rate
    env_errors = sum(1 for t in trajs if t.status.is_infra)
    m[f"{name}/success"] = sum(t.metrics.get("success", 0.0) for t in trajs) / max(len(trajs), 1)
    m[f"{name}/episodes"] = float(len(trajs))
    m[f"{name}/env_errors"] = float(env_errors)
    m[f"{name}/env_error_rate"] = env_errors / max(len(trajs), 1)
    m[f"{name}/seconds"] = time.perf_counter() - t0
    per_task = task_eval(trajs)
    monitor.scalars(m, version)
    write_conversations(monitor, trajs, fmt.tokenizer, version, prefix=f"{name}/conversations")  # a few per task
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / f"{name}-v{version}.json").write_text(
        json.dumps({"version": version, **m, "per_task": per_task}, indent=2))
    log.info("%s v%d: success %.3f over %d held-out episodes, %d env errors (%s)", name, version,
             m[f"{name}/success"], len(trajs), env_errors,
             "; ".join(f"{k} {v['success']:.3f}" for k, v in per_task.items()))
    return m, per_task


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from `path`, or {} if it is missing or unreadable (a report another role may not have written)."""
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}
