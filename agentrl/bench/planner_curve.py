"""The engine's throughput curve from two or more runs at different loads, and a prediction of a run that was not
used to fit it (docs/planner.md, "Out of sample").

One run measures the engine at one load: calibrated alone (`planner_calibrate.calibrate`) it gives one rate, which
the model then holds flat at every load, so it cannot project a looser staleness bound or a larger batch (more
requests in flight, each step of the engine doing more tokens). Runs at different loads give one point each:
run i's point sits at the mean number of generation requests the model keeps in flight on an engine while it
generates (`Result.gen_in_flight_mean`) and its value is the engine throughput at which the modelled rank makes
as many tokens per busy second as the run's rank did. The points depend on one another (the model draws requests
in flight over a spread of loads, so each run sees the curve around its point, not at it), so they are fitted
together: each point by bisection with the others held, a few sweeps, the points moved to where the model then
puts each run's load. Piecewise linear between the points, flat beyond the ends (`Rates.engine_curve`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agentrl.bench.planner import Layout, Rates, Workload, simulate
from agentrl.bench.planner_calibrate import calibrate, layout_of, read_run


@dataclass(frozen=True)
class CurvePoint:
    """One fitting run's share of the fit."""

    run: str
    in_flight: float
    """The model's mean generation requests in flight per engine for this run, with the fitted curve."""
    tokens_per_s: float
    """The engine's throughput at that load."""
    busy_target: float
    """The run's rank: generated tokens per busy second (what the point reproduces)."""
    busy_model: float


def curve_rates(points: list[tuple[float, float]], base: Rates) -> Rates:
    """`base` with the engine curve through (requests in flight, tokens/s) points: the fastest point is the
    reference rate, the others relative to it; loads are rounded to whole requests (the curve's unit) and made
    distinct."""
    pts = sorted(points)
    ref = max(v for _, v in pts)
    curve: list[tuple[int, float]] = []
    for n, v in pts:
        x = max(int(round(n)), 1)
        if curve and x <= curve[-1][0]:
            x = curve[-1][0] + 1
        curve.append((x, v / ref))
    return replace(base, engine_tokens_per_s=ref, engine_curve=tuple(curve))


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def fit_engine_curve(runs: list[tuple[str, Layout, Workload, Rates, float]], seeds: tuple[int, ...] = (0, 1, 2, 3, 4),
                     sweeps: int = 4) -> tuple[Rates, list[CurvePoint]]:
    """The engine curve that makes each run's modelled rank as busy as it was.

    Args:
        runs: (name, layout, workload, rates with the flat engine rate fitted to that run alone, the run's busy
            tokens/s) per run; their layouts must load the engine differently (another staleness bound,
            concurrency or batch).
        seeds: env-latency draws each evaluation averages over.
        sweeps: rounds of fitting every point with the others held.

    Returns the first run's rates with the fitted curve (its other rates are the caller's to replace) and the
    points. Raises ValueError when the runs put the engine at loads too close to tell apart (under 1.5x).
    """
    def model(i: int, rates: Rates) -> tuple[float, float]:
        _, lay, work, _, _ = runs[i]
        res = [simulate(lay, rates, work, s) for s in seeds]
        return _mean([r.rollout_busy_tokens_per_s for r in res]), _mean([r.gen_in_flight_mean for r in res])

    loads = [model(i, r[3])[1] for i, r in enumerate(runs)]
    if max(loads) < 1.5 * min(loads):
        raise ValueError(f"the runs load the engine alike ({', '.join(f'{n:.1f}' for n in loads)} requests in "
                         "flight): fit the curve from runs at different loads (another max_staleness or batch)")
    values = [r[3].engine_tokens_per_s for r in runs]
    base = runs[0][3]
    for _ in range(sweeps):
        for i, (_, _, _, _, target) in enumerate(runs):
            lo, hi = values[i] / 8.0, values[i] * 8.0
            for _ in range(30):
                mid = (lo * hi) ** 0.5
                trial = values[:i] + [mid] + values[i + 1:]
                busy, _ = model(i, curve_rates(list(zip(loads, trial)), base))
                lo, hi = (mid, hi) if busy < target else (lo, mid)
                if hi / lo < 1.002:
                    break
            values[i] = (lo * hi) ** 0.5
        rates = curve_rates(list(zip(loads, values)), base)
        loads = [model(i, rates)[1] for i in range(len(runs))]
    rates = curve_rates(list(zip(loads, values)), base)
    points = [CurvePoint(name, round(loads[i], 2), round(values[i], 1), round(target, 1), round(model(i, rates)[0], 1))
              for i, (name, _, _, _, target) in enumerate(runs)]
    return rates, points


def _med(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def _figures(layout: Layout, rates: Rates, work: Workload, seeds: tuple[int, ...]) -> dict[str, float]:
    res = [simulate(layout, rates, work, s) for s in seeds]
    return {"steady_traj_per_s": _med([r.steady_traj_per_s for r in res]),
            "e2e_traj_per_s": _med([r.e2e_traj_per_s for r in res]),
            "trainer_idle_frac": _med([r.trainer_idle_frac for r in res]),
            "staleness_mean": _mean([r.staleness_mean for r in res]),
            "gen_in_flight_mean": _mean([r.gen_in_flight_mean for r in res])}


def staleness_sweep(layout: Layout, rates: Rates, work: Workload, bounds: tuple[int, ...],
                    seeds: tuple[int, ...] = (0, 1, 2, 3, 4), within: float = 0.05) -> dict[str, Any]:
    """The modelled run at each `algo.max_staleness` in `bounds`, and the bound to use: the smallest whose
    steady throughput is within `within` of the best (a looser bound past it buys only older data)."""
    rows = [{"max_staleness": b, **{k: round(v, 3) for k, v in
                                    _figures(replace(layout, max_staleness=b), rates, work, seeds).items()}}
            for b in sorted(bounds)]
    best = max(r["steady_traj_per_s"] for r in rows)
    pick = next(r for r in rows if r["steady_traj_per_s"] >= (1 - within) * best)
    return {"rows": rows, "recommended_max_staleness": pick["max_staleness"], "within": within}


def predict_run(fit_dirs: list[str | Path], target_dir: str | Path, bench_json: str | Path | None = None,
                swap_s: float = 0.0, seeds: tuple[int, ...] = (0, 1, 2, 3, 4),
                sweep: tuple[int, ...] = ()) -> dict[str, Any]:
    """Fit the engine curve (and the trainer, start-up and workload) on `fit_dirs`, then predict `target_dir`
    from its config alone: its layout is the only thing read from it. The workload (turns, tokens) and the
    trainer's seconds per token are the fitting runs' means. Measured figures: `bench_json`'s medians for the
    target's side (`jobs.bench_pipeline`'s pipeline.json, the side named as the run dir) when given, else the
    target run's own step log. `sweep`: also model the target's layout at these max_staleness bounds
    (`staleness_sweep`)."""
    from agentrl.bench.planner_calibrate import measured_throughput

    cals = [calibrate(d, swap_s=swap_s, seeds=seeds) for d in fit_dirs]
    runs = [(Path(d).name, c["layout"], c["work"], c["rates"], c["measured"].rollout_busy_tokens_per_s)
            for d, c in zip(fit_dirs, cals)]
    rates, points = fit_engine_curve(runs, seeds)
    rates = replace(rates, trainer_step_b_s=_mean([c["rates"].trainer_step_b_s for c in cals]),
                    start_s=_mean([c["rates"].start_s for c in cals]), swap_s=swap_s)
    works = [c["work"] for c in cals]
    work = Workload(turns=_mean([w.turns for w in works]), gen_tokens=_mean([w.gen_tokens for w in works]),
                    episode_tokens=_mean([w.episode_tokens for w in works]),
                    env_call_frac=_mean([w.env_call_frac for w in works]))
    cfg, _, _, _ = read_run(target_dir)
    layout = layout_of(cfg)
    predicted = _figures(layout, rates, work, seeds)
    flat = _figures(layout, replace(cals[0]["rates"], swap_s=swap_s), cals[0]["work"], seeds)["steady_traj_per_s"]
    name = Path(target_dir).name
    if bench_json is not None:
        side = json.loads(Path(bench_json).read_text())["repeats"]["sides"][name]
        measured = {"steady_traj_per_s": side["traj_per_s"]["median"],
                    "e2e_traj_per_s": side["e2e_traj_per_s"]["median"],
                    "trainer_idle_frac": side["trainer_idle_frac"]["median"],
                    "source": f"{bench_json} ({name}, medians)"}
    else:
        seen = measured_throughput(target_dir)
        if seen is None:
            raise ValueError(f"{target_dir}: fewer than two steps logged, nothing to compare the prediction with")
        measured = {"steady_traj_per_s": seen[0], "e2e_traj_per_s": seen[1], "source": f"{target_dir} (its step log)"}
    err = {k: round(predicted[k] / measured[k] - 1, 3) for k in ("steady_traj_per_s", "e2e_traj_per_s")}
    out = {"fit": [p.__dict__ for p in points], "curve": list(rates.engine_curve),
           "engine_tokens_per_s": round(rates.engine_tokens_per_s, 1), "target": name,
           "target_max_staleness": layout.max_staleness,
           "predicted": {k: round(v, 3) for k, v in predicted.items()}, "measured": measured, "error": err,
           "flat_first_run": {"steady_traj_per_s": round(flat, 3),
                              "error": round(flat / measured["steady_traj_per_s"] - 1, 3)}}
    if sweep:
        out["staleness_sweep"] = staleness_sweep(layout, rates, work, sweep, seeds)
    return out
