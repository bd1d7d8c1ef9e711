"""The planner's rates from a run directory's own records (docs/planner.md, "Calibrating").

What comes from where:
    layout          config.yaml through `RunConfig.pipeline` (the same shape the roles use)
    env latency     config.yaml's `rollout.env_latency_s`/`env_latency_sigma` when the run simulated it; a
                    real env's latency is not in the metrics: pass it (`env_median_s`, `env_sigma`)
    episodes        tb: rollout/<task>/turns, rollout/<task>/invalid_calls (turns without an env call);
                    report/trainer.json tokens_trained / trajectories_trained; report/rollout-<r>.json
                    action_tokens / trajectories (per turn: over the turns)
    trainer step    report/trainer.json: (rl_wall_s − idle_s) / tokens_trained seconds per token, a = 0 (one
                    run's batches are all one size, so a fixed cost and a per-token cost cannot be told apart)
    engine rate     fitted: the rate at which the model's rank makes as many tokens per busy second (a second
                    with an episode running, env waits included) as the run's rank did (report/rollout-<r>.json
                    action_tokens / (wall_s − idle_s); or from its first weight swap on, tb:
                    pipeline/rollout_tokens_per_s and pipeline/rollout_idle_frac at that swap)
    start-up        report/trainer.json fill_s minus the model's own fill time
    hand-off        (synchronous runs) the trainer's mean wait from step 2 on (tb: pipeline/trainer_wait_s)
                    minus the model's: publish, notice and weight load, all put into `swap_s`
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from agentrl.bench.planner import Layout, Rates, Workload, simulate
from agentrl.config import RunConfig, config_from_dict
from agentrl.monitor.run_data import Series, read_scalars


@dataclass(frozen=True)
class Measured:
    """What the run itself says (the targets of the fit and the numbers a prediction is checked against)."""

    rollout_busy_tokens_per_s: float
    trainer_wait_s: float
    """Mean trainer wait from step 2 on."""
    fill_s: float
    step_s: float
    trainer_idle_frac: float


def layout_of(cfg: RunConfig) -> Layout:
    """The pipeline's shape as the roles see it (`RunConfig.pipeline`); the lagging pool's engines count as
    ordinary engines (the model has no lagging pool)."""
    shape, pool = cfg.pipeline, cfg.cluster.rollout
    ranks = 1 if cfg.cluster.schedule == "sync" else pool.ranks
    return Layout(ranks=ranks, engines_per_rank=pool.engines_per_rank + pool.lagging_engines_per_rank,
                  concurrency=cfg.rollout.concurrency, group_size=shape.group_size,
                  step_groups=cfg.rollout.groups_per_task * len(cfg.envs.tasks), min_groups=shape.min_groups,
                  max_groups=shape.max_groups, max_staleness=shape.max_staleness, inflight=shape.inflight,
                  steps=shape.steps)


def _mean_over_tasks(scalars: dict[str, Series], leaf: str) -> float | None:
    vals = [float(s.values.mean()) for tag, s in scalars.items()
            if tag.startswith("rollout/") and tag.count("/") == 2 and tag.endswith("/" + leaf)]
    return sum(vals) / len(vals) if vals else None


def busy_rate(scalars: dict[str, Series], rollout: list[dict[str, Any]], skip_first_window: bool = False) -> float:
    """Action tokens per busy second of a rank (a second with an episode running), over the whole run
    (report/rollout-<r>.json, the mean over ranks) or from its first weight swap on (`skip_first_window`: the
    first window's tokens and idle time, from rank 0's tb metrics at that swap, are taken off)."""
    rate, frac = scalars.get("pipeline/rollout_tokens_per_s"), scalars.get("pipeline/rollout_idle_frac")
    tokens = sum(r["action_tokens"] for r in rollout) / len(rollout)
    wall = sum(r["wall_s"] for r in rollout) / len(rollout)
    idle = sum(r["idle_s"] for r in rollout) / len(rollout)
    if not skip_first_window or rate is None or frac is None or len(rate.values) < 2:
        return tokens / max(wall - idle, 1e-9)
    # the first window ends at the first log; its elapsed time, counted back from the last log at the end
    e0 = max(wall - (float(rate.wall[-1]) - float(rate.wall[0])), 1e-9)
    tok0, idle0 = float(rate.values[0]) * e0, float(frac.values[0]) * e0
    return max(tokens - tok0, 1.0) / max((wall - e0) - (idle - idle0), 1e-9)


def read_run(run_dir: str | Path, skip_first_window: bool = False) -> tuple[RunConfig, Workload, Rates, Measured]:
    """The run's config, its episodes, the rates it measured directly (engine rate not yet fitted) and the
    targets of the fit."""
    run_dir = Path(run_dir)
    cfg = config_from_dict(yaml.safe_load((run_dir / "config.yaml").read_text()))
    trainer = json.loads((run_dir / "report" / "trainer.json").read_text())
    rollout = [json.loads(p.read_text()) for p in sorted((run_dir / "report").glob("rollout-*.json"))]
    if not rollout:
        raise FileNotFoundError(f"{run_dir}/report: no rollout-<r>.json (the run did not finish its rollout)")
    scalars = read_scalars(run_dir / "tb")
    n_traj = sum(r["trajectories"] for r in rollout)
    turns = _mean_over_tasks(scalars, "turns") or float(cfg.rollout.max_turns or 1)
    invalid = _mean_over_tasks(scalars, "invalid_calls") or 0.0
    work = Workload(turns=turns, gen_tokens=sum(r["action_tokens"] for r in rollout) / max(n_traj, 1) / turns,
                    episode_tokens=trainer["tokens_trained"] / max(trainer["trajectories_trained"], 1),
                    env_call_frac=max(0.0, 1.0 - invalid / turns))
    busy = trainer["rl_wall_s"] - trainer["idle_s"]
    rates = Rates(engine_tokens_per_s=1.0, trainer_step_b_s=busy / max(trainer["tokens_trained"], 1),
                  env_median_s=cfg.rollout.env_latency_s, env_sigma=cfg.rollout.env_latency_sigma)
    wait = scalars.get("pipeline/trainer_wait_s")
    later = [float(v) for v in wait.values[1:]] if wait is not None and len(wait.values) > 1 else [0.0]
    measured = Measured(busy_rate(scalars, rollout, skip_first_window), sum(later) / len(later),
                        float(trainer.get("fill_s", 0.0)), busy / max(trainer["steps_done"], 1),
                        trainer["idle_s"] / max(trainer["rl_wall_s"], 1e-9))
    return cfg, work, rates, measured


def fit_engine_rate(layout: Layout, rates: Rates, work: Workload, target_busy_tokens_per_s: float,
                    seeds: tuple[int, ...] = (0,)) -> Rates:
    """The engine rate whose modelled rank makes `target` tokens per busy second (bisection in log space:
    the busy rate grows with the engine's rate, less than in proportion, as env waits stay)."""
    lo, hi = target_busy_tokens_per_s * 0.5, target_busy_tokens_per_s * 64.0

    def busy(r: float) -> float:
        rr = replace(rates, engine_tokens_per_s=r)
        return sum(simulate(layout, rr, work, s).rollout_busy_tokens_per_s for s in seeds) / len(seeds)

    if busy(hi) < target_busy_tokens_per_s:  # env waits alone exceed the rank's busy time: the fastest we try
        return replace(rates, engine_tokens_per_s=hi)
    for _ in range(40):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if busy(mid) < target_busy_tokens_per_s else (lo, mid)
        if hi / lo < 1.002:
            break
    return replace(rates, engine_tokens_per_s=(lo * hi) ** 0.5)


def calibrate(run_dir: str | Path, swap_s: float | None = None, seeds: tuple[int, ...] = (0, 1, 2, 3, 4),
              skip_first_window: bool = False) -> dict[str, Any]:
    """Rates fitted to one run. `swap_s`: the hand-off (publish to weights loaded) to use; None: fitted from a
    synchronous run's trainer waits, 0 for an asynchronous one (its waits are the rollout's pace, not the
    hand-off: pass the synchronous run's). `skip_first_window`: fit the engine to the rank's busy rate from its
    first weight swap on (leaves out an engine's warm-up, and a first window that ran on an idler machine)."""
    cfg, work, rates, m = read_run(run_dir, skip_first_window)
    layout = layout_of(cfg)
    rates = fit_engine_rate(layout, rates, work, m.rollout_busy_tokens_per_s, seeds)

    def mean(f: Any) -> float:
        return sum(f(simulate(layout, rates, work, s)) for s in seeds) / len(seeds)

    if swap_s is None:
        swap_s = max(m.trainer_wait_s - mean(_mean_wait), 0.0) if cfg.cluster.schedule == "sync" else 0.0
    rates = replace(rates, swap_s=swap_s)
    rates = replace(rates, start_s=max(m.fill_s - mean(lambda r: r.fill_s), 0.0))
    return {"layout": layout, "rates": rates, "work": work, "measured": m, "schedule": cfg.cluster.schedule}


def _mean_wait(res: Any) -> float:
    ends = res.step_end_s
    if len(ends) < 2:
        return 0.0
    # the trainer's wait between steps: the interval less the step itself
    return sum(b - a for a, b in zip(ends, ends[1:])) / (len(ends) - 1) - res.step_time_s


def measured_throughput(run_dir: str | Path) -> tuple[float, float] | None:
    """(steady, end-to-end) trajectories/s from the run's own step log times (tb: pipeline/trainer_wait_s is
    logged once per step, at its end), `jobs.bench_pipeline`'s definitions; end to end from the first
    batch less the trainer's fill. None with fewer than two steps."""
    run_dir = Path(run_dir)
    s = read_scalars(run_dir / "tb").get("pipeline/trainer_wait_s")
    trainer = json.loads((run_dir / "report" / "trainer.json").read_text())
    if s is None or len(s.wall) < 2:
        return None
    n, per_step = len(s.wall), trainer["trajectories_trained"] / max(trainer["steps_done"], 1)
    wall = [float(w) for w in s.wall]
    steady = (n - 1) * per_step / max(wall[-1] - wall[0], 1e-9)
    e2e = n * per_step / max(wall[-1] - wall[0] + float(s.values[0]) + (trainer["rl_wall_s"] - trainer["idle_s"]) / n,
                             1e-9)
    return steady, e2e


def check_bench(root: str | Path, seeds: tuple[int, ...] = (0, 1, 2, 3, 4), skip_first_window: bool = False
                ) -> dict[str, Any]:
    """The planner's prediction of `jobs.bench_pipeline`'s two runs (root/{sync,async}) against what the bench
    measured (root/pipeline.json). Each schedule is calibrated from its own run dir (the async run's trainer
    and engine have half the cores each, so their rates are its own); the hand-off time comes from the sync
    run, where it can be told apart from the rollout's pace."""
    root = Path(root)
    bench = json.loads((root / "pipeline.json").read_text())
    sync = calibrate(root / "sync", seeds=seeds, skip_first_window=skip_first_window)
    asyn = calibrate(root / "async", swap_s=sync["rates"].swap_s, seeds=seeds, skip_first_window=skip_first_window)
    out: dict[str, Any] = {}
    for name, c in (("sync", sync), ("async", asyn)):
        runs = [simulate(c["layout"], c["rates"], c["work"], s) for s in seeds]
        steady = sorted(r.steady_traj_per_s for r in runs)[len(runs) // 2]
        e2e = sorted(r.e2e_traj_per_s for r in runs)[len(runs) // 2]
        idle = sorted(r.trainer_idle_frac for r in runs)[len(runs) // 2]
        m_steady = bench[f"{name}_traj_per_s"]
        m_e2e = bench["end_to_end"][f"{name}_traj_per_s"]
        out[name] = {"predicted": {"steady_traj_per_s": round(steady, 3), "e2e_traj_per_s": round(e2e, 3),
                                   "trainer_idle_frac": round(idle, 3),
                                   "staleness_mean": round(sum(r.staleness_mean for r in runs) / len(runs), 3)},
                     "measured": {"steady_traj_per_s": m_steady, "e2e_traj_per_s": m_e2e,
                                  "trainer_idle_frac": round(c["measured"].trainer_idle_frac, 3)},
                     "error": {"steady": round(steady / m_steady - 1, 3), "e2e": round(e2e / m_e2e - 1, 3)},
                     "fitted": _rates_dict(c["rates"], c["work"])}
    ratio_p = out["async"]["predicted"]["steady_traj_per_s"] / out["sync"]["predicted"]["steady_traj_per_s"]
    out["async_over_sync"] = {"predicted": round(ratio_p, 3), "measured": bench["async_over_sync"],
                              "error": round(ratio_p / bench["async_over_sync"] - 1, 3)}
    if "staleness_mean" in bench:
        out["async"]["measured"]["staleness_mean"] = bench["staleness_mean"]
    return out


def _rates_dict(rates: Rates, work: Workload) -> dict[str, float]:
    return {"engine_tokens_per_s": round(rates.engine_tokens_per_s, 1),
            "trainer_tokens_per_s": round(1.0 / max(rates.trainer_step_b_s, 1e-12), 1),
            "env_median_s": rates.env_median_s, "env_sigma": rates.env_sigma, "swap_s": round(rates.swap_s, 3),
            "start_s": round(rates.start_s, 2), "turns": round(work.turns, 2), "gen_tokens": round(work.gen_tokens, 1),
            "episode_tokens": round(work.episode_tokens, 1), "env_call_frac": round(work.env_call_frac, 3)}
