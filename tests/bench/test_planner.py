"""The pipeline planner (agentrl.bench.planner): hand-computable cases of the event model, its admission rule
against the rollout role's own, and the engine-rate fit recovering a known rate."""
from __future__ import annotations

import random
from dataclasses import replace
from types import SimpleNamespace

import pytest

from agentrl.bench.planner import Layout, Rates, Workload, admit_limit, groups_of_rank, simulate, with_schedule
from agentrl.bench.planner_calibrate import fit_engine_rate

# 4 groups of 4: 16 episodes of 3 turns x 10 tokens on one engine of 100 tokens/s -> 4.8 s of generation
WORK = Workload(turns=3, gen_tokens=10, episode_tokens=100)
SYNC = Layout.sync(step_groups=4, group_size=4, concurrency=64, steps=30)
ROLLOUT_S = 16 * 3 * 10 / 100.0


def test_sync_is_rollout_then_train_then_handoff() -> None:
    """Zero env latency, one rank, the sync schedule: each step is the rollout, the train step (a + b·tokens),
    the publish and the weight load, one after another."""
    rates = Rates(engine_tokens_per_s=100.0, trainer_step_a_s=0.5, trainer_step_b_s=1e-3, publish_s=0.3, swap_s=0.2)
    res = simulate(SYNC, rates, WORK)
    train_s = 0.5 + 16 * 100 * 1e-3
    assert res.steady_traj_per_s == pytest.approx(16 / (ROLLOUT_S + train_s + 0.3 + 0.2), rel=1e-9)
    assert res.e2e_traj_per_s == pytest.approx(30 * 16 / (30 * (ROLLOUT_S + train_s) + 29 * 0.5), rel=1e-9)
    assert res.trainer_idle_frac == pytest.approx(29 * (ROLLOUT_S + 0.5) / (29 * (ROLLOUT_S + 0.5) + 30 * train_s))
    assert res.staleness_max == 0 and res.dropped_stale == 0


@pytest.mark.parametrize("b, bound_s", [(5e-3, 8.0), (1e-3, ROLLOUT_S)])
def test_async_overlaps_rollout_and_training(b: float, bound_s: float) -> None:
    """Staleness 1: rollout and training overlap, so a step takes the slower of the two (trainer-bound:
    8 s of training against 4.8 s of rollout; rollout-bound: 4.8 s against 1.6 s)."""
    rates = Rates(engine_tokens_per_s=100.0, trainer_step_b_s=b)
    res = simulate(with_schedule(replace(SYNC, steps=60), "async", max_staleness=1), rates, WORK)
    assert res.steady_traj_per_s == pytest.approx(16 / bound_s, rel=0.03)
    assert res.staleness_max <= 1 and res.dropped_stale == 0
    sync = simulate(SYNC, rates, WORK)
    assert res.steady_traj_per_s > 1.3 * sync.steady_traj_per_s


def test_trainer_bound_async_leaves_the_trainer_busy() -> None:
    rates = Rates(engine_tokens_per_s=100.0, trainer_step_b_s=5e-3)
    res = simulate(with_schedule(replace(SYNC, steps=60), "async", max_staleness=1), rates, WORK)
    assert res.trainer_idle_frac < 0.02
    assert res.rollout_idle_frac[0] > 0.3  # the rank waits at the staleness bound


def test_abort_restarts_and_costs_throughput() -> None:
    rates = Rates(engine_tokens_per_s=100.0, trainer_step_b_s=1e-3, env_median_s=0.2, env_sigma=0.5)
    lay = with_schedule(replace(SYNC, steps=20), "async", max_staleness=1)
    swap = simulate(lay, rates, WORK)
    abort = simulate(replace(lay, inflight="abort"), rates, WORK)
    assert abort.aborted > 0 and swap.aborted == 0
    assert abort.steady_traj_per_s < swap.steady_traj_per_s


def test_engine_curve_interpolates() -> None:
    r = Rates(engine_tokens_per_s=100.0, engine_curve=((1, 0.1), (11, 1.1), (21, 2.1)))
    assert [r.engine_rate(n) for n in (0, 1, 6, 16, 40)] == pytest.approx([0.0, 10.0, 60.0, 160.0, 210.0])


@pytest.mark.parametrize("staleness, version, base, per_step", [(0, 0, 0, 4), (1, 3, 0, 2), (2, 7, 5, 3)])
def test_admission_is_the_rollout_loops(staleness: int, version: int, base: int, per_step: int) -> None:
    from agentrl.rollout.role import RolloutLoop

    loop = SimpleNamespace(place=SimpleNamespace(max_staleness=staleness), engine=SimpleNamespace(version=version),
                           base_version=base, per_step=per_step)
    assert admit_limit(staleness, version, base, per_step) == RolloutLoop._admit_limit(loop)  # type: ignore[arg-type]


def test_groups_split_over_ranks_as_the_rank_plan() -> None:
    from agentrl.rollout.role import RankPlace

    spec = SimpleNamespace(rollout=SimpleNamespace(groups_per_task=7), tasks=["a", "b"])
    for ranks in (1, 3, 4):
        got = [groups_of_rank(14, ranks, r) for r in range(ranks)]
        assert got == [RankPlace(r, ranks, 1).groups_per_step(spec) for r in range(ranks)]  # type: ignore[arg-type]
        assert sum(got) == 14


def test_rank_never_starts_beyond_the_bound() -> None:
    """With a slow trainer the rank runs the whole bound ahead: 3 steps' groups on v0, then one step's more per
    version, so steps 1..5 train on data 0, 1, 2, 2, 2 versions old."""
    rates = Rates(engine_tokens_per_s=1e4, trainer_step_b_s=1e-2)
    res = simulate(with_schedule(replace(SYNC, steps=5), "async", max_staleness=2), rates, WORK)
    assert res.staleness_max <= 2 and res.dropped_stale == 0
    assert res.staleness_mean == pytest.approx((0 + 1 + 2 + 2 + 2) / 5)
    assert res.trajectories_trained == 5 * 16


def test_fit_recovers_a_known_engine_rate() -> None:
    truth = Rates(engine_tokens_per_s=250.0, trainer_step_b_s=1e-3, env_median_s=0.3, env_sigma=0.99)
    lay = replace(SYNC, steps=8)
    target = simulate(lay, truth, WORK, seed=3).rollout_busy_tokens_per_s
    fitted = fit_engine_rate(lay, replace(truth, engine_tokens_per_s=1.0), WORK, target, seeds=(3,))
    assert fitted.engine_tokens_per_s == pytest.approx(250.0, rel=0.01)


def test_env_latency_draws_have_the_configured_median() -> None:
    r = Rates(engine_tokens_per_s=1.0, env_median_s=0.3, env_sigma=0.99)
    rng = random.Random(0)
    draws = sorted(r.env_draw(rng) for _ in range(4001))
    assert draws[2000] == pytest.approx(0.3, rel=0.08)
    assert Rates(engine_tokens_per_s=1.0, env_samples=(0.5,)).env_draw(rng) == 0.5


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """A run directory as the roles leave it: config.yaml, report/trainer.json, report/rollout-0.json and tb
    scalars, with numbers chosen by hand (80 trajectories of 3 turns, 2 of them calling no env)."""
    import json

    import yaml

    from agentrl.config import load_config, to_dict
    from agentrl.monitor.tensorboard import Monitor

    run = tmp_path_factory.mktemp("run")
    cfg = load_config("smoke", ["trainer.steps=5", "rollout.groups_per_task=4", "rollout.concurrency=64",
                                "rollout.env_latency_s=0.3", "rollout.max_turns=3"])
    (run / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg)))
    (run / "report").mkdir()
    (run / "report" / "trainer.json").write_text(json.dumps(
        {"steps_done": 5, "rl_wall_s": 30.0, "idle_s": 10.0, "fill_s": 12.0, "tokens_trained": 25000,
         "trajectories_trained": 80}))
    (run / "report" / "rollout-0.json").write_text(json.dumps(
        {"trajectories": 80.0, "action_tokens": 7200.0, "wall_s": 40.0, "idle_s": 16.0}))
    mon = Monitor(run / "tb", "rollout-0")
    for step in range(5):
        mon.scalars({"rollout/lookup/turns": 3.0, "rollout/lookup/invalid_calls": 2.0,
                     "pipeline/trainer_wait_s": 4.0}, step)
    mon.close()
    return run


def test_calibration_reads_the_run_and_matches_its_rank(small_run) -> None:
    from agentrl.bench.planner_calibrate import calibrate, read_run

    cfg, work, rates, m = read_run(small_run)
    assert (work.turns, work.gen_tokens, work.episode_tokens) == (3.0, 7200 / 80 / 3, 25000 / 80)
    assert work.env_call_frac == pytest.approx(1 / 3)
    assert rates.trainer_step_b_s == pytest.approx(20.0 / 25000)
    assert (rates.env_median_s, m.rollout_busy_tokens_per_s, m.trainer_wait_s) == (0.3, 7200 / 24, 4.0)
    c = calibrate(small_run, seeds=(0, 1))
    assert c["layout"].max_staleness == 0 and c["layout"].min_groups == 4  # the smoke preset: sync
    busy = [simulate(c["layout"], c["rates"], c["work"], s).rollout_busy_tokens_per_s for s in (0, 1)]
    assert sum(busy) / 2 == pytest.approx(7200 / 24, rel=0.01)
    fills = [simulate(c["layout"], c["rates"], c["work"], s).fill_s for s in (0, 1)]
    assert sum(fills) / 2 == pytest.approx(12.0)  # start-up: the run's fill less the model's own


def test_plan_pipeline_command_projects_a_preset() -> None:
    """The entry point end to end, in its own process (tests do not import jobs/)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-m", "jobs.plan_pipeline", "--preset", "smoke", "--engine-tokens-per-s", "300",
                          "--trainer-tokens-per-s-per-gpu", "1500", "--env-median-s", "0.1", "--turns", "3",
                          "--gen-tokens", "29", "--totals", "3", "--granularity", "1", "--steps", "4", "--json"],
                         cwd=root, capture_output=True, text=True, timeout=120, check=True).stdout
    res = json.loads(out)
    assert [r["trainer_gpus"] for r in res["sweeps"][0]["rows"]] == [1, 2]
    split = res["preset_split"]
    assert split["sync"]["staleness_max"] == 0 and split["async"]["staleness_mean"] > 0
    assert split["async"]["steady_traj_per_s"] > split["sync"]["steady_traj_per_s"]
