"""The engine-curve fit (agentrl.bench.planner_curve): from two runs of a known, load-dependent engine it recovers
a curve that predicts a third layout the fit never saw, where one run's flat rate does not."""
from __future__ import annotations

from dataclasses import replace

import pytest

from agentrl.bench.planner import Layout, Rates, Workload, simulate
from agentrl.bench.planner_calibrate import fit_engine_rate
from agentrl.bench.planner_curve import curve_rates, fit_engine_curve

SEEDS = (0, 1, 2)
WORK = Workload(turns=3, gen_tokens=30, episode_tokens=300, env_call_frac=0.5)
# an engine whose throughput grows with its batch: 100 tokens/s alone, 1,000 from 40 requests on
TRUTH = Rates(engine_tokens_per_s=1000.0, engine_curve=((1, 0.1), (40, 1.0)), trainer_step_b_s=1 / 5000,
              env_median_s=0.3, env_sigma=0.99, start_s=2.0)
ASYNC = Layout(ranks=1, engines_per_rank=1, concurrency=64, group_size=4, step_groups=4, min_groups=4,
               max_groups=4, max_staleness=1, inflight="swap", steps=12)


def _busy(layout: Layout, rates: Rates) -> float:
    return sum(simulate(layout, rates, WORK, s).rollout_busy_tokens_per_s for s in SEEDS) / len(SEEDS)


def _steady(layout: Layout, rates: Rates) -> float:
    xs = sorted(simulate(layout, rates, WORK, s).steady_traj_per_s for s in SEEDS)
    return xs[len(xs) // 2]


def _run(name: str, staleness: int) -> tuple[str, Layout, Workload, Rates, float]:
    """What calibrating one run gives: its layout, the busy rate it measured, the flat rate fitted to it."""
    lay = replace(ASYNC, max_staleness=staleness)
    target = _busy(lay, TRUTH)
    flat = fit_engine_rate(lay, replace(TRUTH, engine_tokens_per_s=1.0, engine_curve=((1, 1.0),)), WORK, target, SEEDS)
    return name, lay, WORK, flat, target


def test_curve_rates_puts_points_on_whole_distinct_loads() -> None:
    r = curve_rates([(7.6, 300.0), (2.2, 100.0), (2.4, 150.0)], Rates(engine_tokens_per_s=1.0))
    assert r.engine_tokens_per_s == 300.0
    assert r.engine_curve == ((2, 100 / 300), (3, 150 / 300), (8, 1.0))
    assert [round(r.engine_rate(n), 6) for n in (1, 2, 3, 8, 50)] == [100.0, 100.0, 150.0, 300.0, 300.0]


def test_two_runs_fit_a_curve_that_predicts_a_third_layout() -> None:
    runs = [_run("s1", 1), _run("s8", 8)]
    rates, points = fit_engine_curve(runs, SEEDS, sweeps=3)
    assert points[0].in_flight < points[1].in_flight / 1.5  # the two runs load the engine differently
    for p in points:  # each run's rank is as busy in the model as it was
        assert p.busy_model == pytest.approx(p.busy_target, rel=0.02)
    # the fitted values sit near the true curve at the runs' loads (the curve is what the data could say)
    for p in points:
        assert p.tokens_per_s == pytest.approx(TRUTH.engine_rate(round(p.in_flight)), rel=0.25)
    mid = replace(ASYNC, max_staleness=4)
    truth, fitted = _steady(mid, TRUTH), _steady(mid, replace(rates, trainer_step_b_s=TRUTH.trainer_step_b_s,
                                                               start_s=TRUTH.start_s, env_median_s=0.3,
                                                               env_sigma=0.99))
    flat = _steady(mid, runs[0][3])
    assert fitted == pytest.approx(truth, rel=0.10)
    assert abs(flat / truth - 1) > 0.25  # one run's flat rate is what this fit replaces: it misses by more


def test_staleness_sweep_recommends_the_smallest_bound_near_the_best() -> None:
    from agentrl.bench.planner_curve import staleness_sweep

    sw = staleness_sweep(ASYNC, TRUTH, WORK, (8, 1, 2, 4, 16), SEEDS)
    rows = sw["rows"]
    assert [r["max_staleness"] for r in rows] == [1, 2, 4, 8, 16]
    assert rows[0]["staleness_mean"] <= 1 and rows[-1]["staleness_mean"] > rows[0]["staleness_mean"]
    best = max(r["steady_traj_per_s"] for r in rows)
    pick = sw["recommended_max_staleness"]
    assert [r["steady_traj_per_s"] >= 0.95 * best for r in rows].index(True) == [1, 2, 4, 8, 16].index(pick)
    assert 1 < pick < 16  # this engine is window-bound at 1 and saturated long before 16
    assert staleness_sweep(ASYNC, TRUTH, WORK, (3,), SEEDS)["recommended_max_staleness"] == 3


def test_runs_at_one_load_cannot_fit_a_curve() -> None:
    with pytest.raises(ValueError, match="load the engine alike"):
        fit_engine_curve([_run("a", 1), _run("b", 1)], SEEDS)


def _run_dir(path, staleness: int, step_walls: list[float]):
    """An async run directory as the roles leave it (config, reports, the trainer's per-step tb log): 160
    trajectories of 3 turns x 30 tokens in 10 steps, a third of the turns without an env call, its rank as busy
    as TRUTH's engine makes it in this layout, its trainer at TRUTH's rate."""
    import json

    import yaml
    from torch.utils.tensorboard import SummaryWriter

    from agentrl.bench.planner_calibrate import layout_of
    from agentrl.config import load_config, to_dict

    path.mkdir(parents=True)
    cfg = load_config("smoke", ["cluster.schedule=async", f"algo.max_staleness={staleness}", "trainer.steps=10",
                                "rollout.groups_per_task=4", "rollout.concurrency=64", "rollout.env_latency_s=0.3",
                                "rollout.max_turns=3"])
    work = Workload(turns=3, gen_tokens=30, episode_tokens=300, env_call_frac=2 / 3)
    busy = sum(simulate(layout_of(cfg), TRUTH, work, s).rollout_busy_tokens_per_s for s in SEEDS) / len(SEEDS)
    (path / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg)))
    (path / "report").mkdir()
    wall = step_walls[-1] - step_walls[0] + 10.0
    (path / "report" / "trainer.json").write_text(json.dumps(
        {"steps_done": 10, "rl_wall_s": wall, "idle_s": wall - 48000 * TRUTH.trainer_step_b_s, "fill_s": 8.0,
         "tokens_trained": 48000, "trajectories_trained": 160}))
    (path / "report" / "rollout-0.json").write_text(json.dumps(
        {"trajectories": 160.0, "action_tokens": 14400.0, "wall_s": 14400.0 / busy, "idle_s": 0.0}))
    tb = SummaryWriter(log_dir=str(path / "tb"))
    for step, w in enumerate(step_walls):  # logged at each step's end, at these wall times
        for tag, v in (("rollout/lookup/turns", 3.0), ("rollout/lookup/invalid_calls", 1.0),
                       ("pipeline/trainer_wait_s", 1.0)):
            tb.add_scalar(tag, v, step, walltime=w)
    tb.close()
    return path


def test_plan_pipeline_predicts_a_run_from_two_others(tmp_path) -> None:
    """`jobs.plan_pipeline --predict` end to end in its own process: two fitting runs at staleness 1 and 8, the
    curve through both, a prediction of the staleness-4 run compared with its own step log."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    a = _run_dir(tmp_path / "b" / "async", 1, [10.0 + 3.0 * i for i in range(10)])
    b = _run_dir(tmp_path / "b" / "async-s8-r1", 8, [10.0 + 1.5 * i for i in range(10)])
    c = _run_dir(tmp_path / "b" / "async-s4-r1", 4, [10.0 + 2.0 * i for i in range(10)])
    cmd = [sys.executable, "-m", "jobs.plan_pipeline", "--predict", str(c)]
    done = subprocess.run(cmd + ["--fit", str(a), str(b)], cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout[:done.stdout.rindex("}") + 1])
    s1, s8 = out["fit"]
    assert s1["in_flight"] < s8["in_flight"] and s1["tokens_per_s"] < s8["tokens_per_s"]
    for p in (s1, s8):
        assert p["busy_model"] == pytest.approx(p["busy_target"], rel=0.03)
    assert out["measured"]["steady_traj_per_s"] == pytest.approx(9 * 16 / 18.0)  # its own step log
    assert out["error"]["steady_traj_per_s"] == pytest.approx(
        out["predicted"]["steady_traj_per_s"] / out["measured"]["steady_traj_per_s"] - 1, abs=2e-3)
    swept = subprocess.run(cmd + ["--fit", str(a), str(b), "--sweep-staleness", "1,4,16"], cwd=root,
                           capture_output=True, text=True, timeout=300)
    assert swept.returncode == 0, swept.stderr
    assert "recommended algo.max_staleness=" in swept.stdout
    one = subprocess.run(cmd + ["--fit", str(a)], cwd=root, capture_output=True, text=True, timeout=120)
    assert one.returncode == 2 and "two or more run directories" in one.stderr
