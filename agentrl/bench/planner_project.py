"""A preset's cluster layout through the planner (docs/planner.md, "Projecting"): sync against async at the
preset's own GPU split, and the rollout:trainer split that trains the most trajectories per second for a
given number of GPUs.

GPU accounting (our assumptions, not measured): an engine takes `tensor_parallel_size` GPUs; a rank keeps the
preset's engines per rank (current + lagging pool), so more rollout GPUs means more ranks, each with the
preset's `rollout.concurrency`; the trainer's tokens/s grows in proportion to its GPUs (data parallel, no
communication cost). The synchronous baseline uses the same ranks and engines with staleness 0, drain and one
step's groups per step (agentrl's own `cluster.schedule=sync` runs one rank; the paper's baseline, like ours
here, gives the synchronous schedule the same engines).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from agentrl.bench.planner import Layout, Rates, Workload, simulate_mean, with_schedule
from agentrl.config import RunConfig


@dataclass(frozen=True)
class ClusterRates:
    """What a user supplies for a cluster: per engine, per trainer GPU, per env call."""

    engine_tokens_per_s: float
    trainer_tokens_per_s_per_gpu: float
    env_median_s: float = 1.0
    env_sigma: float = 0.99
    trainer_step_a_s: float = 0.0
    publish_s: float = 2.0
    swap_s: float = 2.0
    engine_curve: tuple[tuple[int, float], ...] = ((1, 1.0),)
    env_samples: tuple[float, ...] = ()

    def rates(self, trainer_gpus: int) -> Rates:
        return Rates(engine_tokens_per_s=self.engine_tokens_per_s, trainer_step_a_s=self.trainer_step_a_s,
                     trainer_step_b_s=1.0 / (self.trainer_tokens_per_s_per_gpu * trainer_gpus),
                     env_median_s=self.env_median_s, env_sigma=self.env_sigma, publish_s=self.publish_s,
                     swap_s=self.swap_s, engine_curve=self.engine_curve, env_samples=self.env_samples)


def preset_gpus(cfg: RunConfig) -> tuple[int, int]:
    """(trainer GPUs, rollout GPUs) the preset asks for; a CPU preset (gpus_per_node 0) counts one device per
    trainer rank and one per rollout engine."""
    t, r = cfg.cluster.trainer, cfg.cluster.rollout
    trainer = t.nodes * t.gpus_per_node or t.nodes * t.ranks_per_node
    rollout = r.nodes * r.gpus_per_node or r.ranks * (r.engines_per_rank + r.lagging_engines_per_rank)
    return max(trainer, 1), max(rollout, 1)


def layout_for(cfg: RunConfig, rollout_gpus: int, steps: int) -> Layout:
    """The preset's asynchronous layout on `rollout_gpus` GPUs (see the module's GPU accounting)."""
    pool, shape = cfg.cluster.rollout, cfg.pipeline
    per_rank = pool.engines_per_rank + pool.lagging_engines_per_rank
    engines = max(rollout_gpus // max(pool.tensor_parallel_size, 1), 1)
    ranks = max(engines // per_rank, 1)
    return Layout(ranks=ranks, engines_per_rank=max(engines // ranks, 1), concurrency=cfg.rollout.concurrency,
                  group_size=shape.group_size, step_groups=cfg.rollout.groups_per_task * len(cfg.envs.tasks),
                  min_groups=shape.min_groups, max_groups=shape.max_groups, max_staleness=shape.max_staleness,
                  inflight=shape.inflight, steps=steps)


def project(cfg: RunConfig, cr: ClusterRates, work: Workload, trainer_gpus: int, rollout_gpus: int, steps: int,
            seeds: tuple[int, ...] = (0,)) -> dict[str, Any]:
    """Sync and async at one split."""
    base = layout_for(cfg, rollout_gpus, steps)
    rates = cr.rates(trainer_gpus)
    out: dict[str, Any] = {"trainer_gpus": trainer_gpus, "rollout_gpus": rollout_gpus, "ranks": base.ranks,
                           "engines": base.ranks * base.engines_per_rank}
    for name in ("sync", "async"):  # async: the preset's own bound and in-flight policy, even on a sync preset
        lay = with_schedule(base, name, max(cfg.algo.max_staleness, 1), cfg.transport.inflight)
        if name == "async" and cfg.cluster.schedule == "sync":  # its batch as async's default: one step's groups
            lay = replace(lay, min_groups=lay.step_groups, max_groups=lay.step_groups)
        out[name] = simulate_mean(lay, rates, work, seeds)
    out["async_over_sync"] = out["async"]["steady_traj_per_s"] / max(out["sync"]["steady_traj_per_s"], 1e-12)
    return out


def best_split(cfg: RunConfig, cr: ClusterRates, work: Workload, total_gpus: int, steps: int, granularity: int,
               seeds: tuple[int, ...] = (0,)) -> dict[str, Any]:
    """Every split of `total_gpus` in steps of `granularity` (a node, say); the best for each schedule."""
    rows = [project(cfg, cr, work, t, total_gpus - t, steps, seeds)
            for t in range(granularity, total_gpus, granularity)]
    best = {name: max(rows, key=lambda r: r[name]["steady_traj_per_s"]) for name in ("sync", "async")}
    return {"total_gpus": total_gpus, "rows": rows,
            "best": {name: {"trainer_gpus": b["trainer_gpus"], "rollout_gpus": b["rollout_gpus"],
                            "traj_per_s": b[name]["steady_traj_per_s"]} for name, b in best.items()},
            "best_async_over_best_sync": best["async"]["async"]["steady_traj_per_s"]
            / max(best["sync"]["sync"]["steady_traj_per_s"], 1e-12)}


def default_workload(cfg: RunConfig, turns: float | None, gen_tokens: float, obs_tokens: float,
                     prompt_tokens: float) -> Workload:
    """An episode of the preset when no run has measured one: `turns` (default half the turn cap), each turn
    `gen_tokens` generated and `obs_tokens` observed, after a `prompt_tokens` prompt."""
    t = turns if turns is not None else max((cfg.rollout.max_turns or 10) / 2, 1.0)
    return Workload(turns=t, gen_tokens=gen_tokens, episode_tokens=prompt_tokens + t * (gen_tokens + obs_tokens))

