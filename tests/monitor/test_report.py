"""The run report from a small real run dir: TensorBoard event files written by the project's Monitor,
HDF5 shards written by ShardWriter, and the json files of report/. What each plot drew (read back from
the figure's artists) must equal the data written; a run in progress renders too, saying what is missing."""
from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml

from agentrl.monitor.eval_results import ResultsFile, ScoredEpisode, aggregate, read_results
from agentrl.monitor.eval_stats import wilson_interval
from agentrl.monitor.plots import status_mix
from agentrl.monitor.report import write_report
from agentrl.monitor.run_data import load_run
from agentrl.monitor.tensorboard import Monitor
from agentrl.transport.shards import ShardReader, ShardWriter, read_shard, shard_dir
from agentrl.types import Trajectory

STEPS = 5
REWARD = {"alpha": [0.1, 0.3, 0.2, 0.6, 0.8], "beta": [0.0, 0.0, 0.5, 0.5, 1.0]}
SUCCESS = {"alpha": [0.0, 0.25, 0.25, 0.5, 0.75], "beta": [0.0, 0.0, 0.5, 0.5, 1.0]}
HIST = {0: [6, 5, 4, 8, 2], 1: [2, 3, 4, 0, 6], 2: [0, 0, 0, 0, 1]}  # trajectories per step by staleness
TOKENS_PER_S = [100.0, 150.0, 120.0, 180.0, 160.0]
IDLE = [0.5, 0.4, 0.35, 0.3, 0.25]
EVALS = {("eval", 0): {"alpha": (0.2, 0.05, {"completed": 4, "turn_limit": 16}), "beta": (0.0, 0.0, {"env_error": 20})},
         ("eval", 4): {"alpha": (0.9, 0.04, {"completed": 18, "turn_limit": 2}), "beta": (0.6, 0.1, {"completed": 20})},
         ("eval_sampled", 0): {"alpha": (0.1, 0.03, {"completed": 8}), "beta": (0.05, 0.02, {"completed": 8})},
         ("eval_sampled", 4): {"alpha": (0.7, 0.05, {"completed": 8}), "beta": (0.98, 0.02, {"completed": 8})}}


def traj(task: str, status: str, versions: list[int]) -> Trajectory:
    """Two context tokens, then one action token per entry of `versions` (the version that sampled it)."""
    n = 2 + len(versions)
    return Trajectory(traj_id=f"{task}-{status}-{versions}", task=task, index="0", group_id="g", tokens=np.arange(n),
                      loss_mask=[0, 0] + [1] * len(versions), logprobs=np.zeros(n),
                      policy_version=[-1, -1] + versions, engine=[-1, -1] + [0] * len(versions), reward=1.0,
                      status=status, num_turns=1)


TRAJS = [traj("alpha", "completed", [0, 0, 1]), traj("alpha", "turn_limit", [1, 1]),
         traj("beta", "completed", [2, 3, 3, 3]), traj("beta", "env_error", [3]), traj("beta", "completed", [4])]


def build_run(root: Path) -> Path:
    run = root / "tiny"
    (run / "report").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({
        "name": "tiny", "seed": 3, "envs": {"tasks": ["alpha", "beta"]}, "cluster": {"schedule": "async"},
        "trainer": {"steps": STEPS, "lr": 1e-5}, "rollout": {"groups_per_task": 2, "group_size": 4},
        "model": {"path": "/models/tiny"}}))
    trainer, rollout = Monitor(run / "tb", "trainer"), Monitor(run / "tb", "rollout")
    for step in range(STEPS):
        m = {f"rollout/{t}/{k}": v[step] for t in REWARD for k, v in (("reward", REWARD[t]), ("success", SUCCESS[t]))}
        m.update({f"pipeline/staleness_hist/{k}": float(v[step]) for k, v in HIST.items() if v[step]})
        m.update({"pipeline/train_tokens_per_s": TOKENS_PER_S[step], "pipeline/trainer_idle_frac": IDLE[step],
                  "train/loss": 0.1 * step, "pipeline/trainer_wait_s": 2.0})
        trainer.scalars(m, step)
        rollout.scalars({"pipeline/rollout_tokens_per_s": 2 * TOKENS_PER_S[step],
                         "pipeline/rollout_window_bound_frac": 0.8 + 0.01 * step,
                         "rollout/alpha/success": 0.99}, step)  # the trainer's file sorts first and wins
    for (kind, v), per_task in EVALS.items():
        body = {"version": v, "per_task": {t: {"success": s, "stderr": e, "episodes": sum(st.values()), "status": st}
                                           for t, (s, e, st) in per_task.items()}}
        (run / "report" / f"{kind}-v{v}.json").write_text(json.dumps(body))
        rollout.scalars({f"{kind}/seconds": 10.0 + v}, v)
    trainer.close()
    rollout.close()
    ShardWriter(shard_dir(run, "rollout", 0)).write(TRAJS[:3])
    ShardWriter(shard_dir(run, "rollout", 0)).write(TRAJS[3:])
    ShardWriter(shard_dir(run, "expert", 0)).write([traj("alpha", "completed", [-2])])  # not the policy's
    (run / "weights" / "v4").mkdir(parents=True)
    (run / "report" / "trainer.json").write_text(json.dumps({"steps_done": STEPS, "steps": STEPS, "idle_s": 12.0}))
    (run / "report" / "summary.json").write_text(json.dumps({"wall_s": 321.0, "steps": STEPS, "rl_steps": STEPS}))
    return run


def shards_of(run: Path) -> list[Trajectory]:
    return [t for d in sorted((run / "shards").glob("rollout-*")) for p in ShardReader(d).available()
            for t in read_shard(p)]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    run = build_run(tmp_path_factory.mktemp("runs"))
    with ResultsFile(run / "report" / "eval-test.jsonl") as rf:
        for task, wins in (("db", [1, 1, 0, 1]), ("os", [0, 1, 0, 0])):
            for sample, w in enumerate(wins):
                rf.append(ScoredEpisode(task, "test", "i0", sample, float(w), float(w), "completed", 3, 90, 1.5))
    results = aggregate(read_results(run / "report" / "eval-test.jsonl"), ks=(1, 2, 3, 4))
    data = load_run(run, shards_of(run))
    report = write_report(data, run / "report", results, "tiny model")
    return run, data, report, {p.name: p for p in report.plots}


def test_curves_equal_the_tensorboard_data(rendered):
    _, _, _, plots = rendered
    s = plots["task_curves"].series
    for task in REWARD:
        assert s[f"rollout reward per task|{task}"] == {"x": list(range(STEPS)), "y": pytest.approx(REWARD[task])}
        assert s[f"rollout success per task|{task}"]["y"] == pytest.approx(SUCCESS[task])
    assert s["rollout success per task|alpha greedy eval (at version)"] == {"x": [0.0, 4.0], "y": [0.2, 0.9]}
    assert s["rollout success per task|beta sampled eval (at version)"]["y"] == pytest.approx([0.05, 0.98])


def test_staleness_equals_tensorboard_and_shards(rendered):
    _, _, _, plots = rendered
    s = plots["staleness"].series
    hist = s["trajectories by staleness when trained on|trajectories"]
    assert hist["x"] == [0, 1, 2] and hist["y"] == pytest.approx([sum(HIST[k]) for k in (0, 1, 2)])
    # Lag behind each trajectory's newest action token: [0,0,1] -> 1,1,0; [1,1] -> 0,0; [2,3,3,3] -> 1,0,0,0; ...
    want = Counter()
    for t in TRAJS:
        v = [x for x in t.policy_version.tolist() if x >= 0]
        want.update(max(v) - x for x in v)
    lag = s["action tokens by versions behind their trajectory's newest|tokens"]
    assert dict(zip(lag["x"], lag["y"])) == dict(want) == {0: 8, 1: 3}


def test_throughput_and_idle_over_time(rendered):
    _, data, _, plots = rendered
    s = plots["throughput"].series
    assert s["tokens per second|train_tokens_per_s"]["y"] == TOKENS_PER_S
    assert s["tokens per second|rollout_tokens_per_s"]["y"] == [2 * x for x in TOKENS_PER_S]
    assert s["idle fraction|trainer_idle_frac"]["y"] == pytest.approx(IDLE)
    t0 = min(float(x.wall.min()) for x in data.scalars.values())
    assert s["idle fraction|trainer_idle_frac"]["x"] == pytest.approx(
        ((data.scalars["pipeline/trainer_idle_frac"].wall - t0) / 60).tolist())
    assert plots["throughput"].notes == ["trajectories per second: not in tb/: pipeline/trajectories_per_s"]


def test_eval_bars_and_status_mix(rendered):
    _, _, _, plots = rendered
    s = plots["eval_before_after"].series
    first = "held-out success, first and last evaluation (95% Wilson interval)"
    greedy0 = s[f"{first}|greedy v0"]
    assert greedy0["y"] == pytest.approx([0.2, 0.0])
    # alpha: 4 of 20 episodes, beta 0 of 20 (whose interval still has a width)
    assert greedy0["lo"] == pytest.approx([wilson_interval(4, 20).lo, 0.0])
    assert greedy0["hi"] == pytest.approx([wilson_interval(4, 20).hi, wilson_interval(0, 20).hi])
    assert greedy0["hi"][1] > 0.1
    assert s[f"{first}|sampled v4"]["hi"] == pytest.approx([wilson_interval(0.7 * 8, 8).hi, wilson_interval(0.98 * 8, 8).hi])
    assert s[f"{first}|ticks"] == {"labels": ["alpha", "beta"]}
    results = s["evaluation results files (95% t-interval over runs)|test"]
    assert results["y"] == pytest.approx([0.75, 0.25])
    curves = plots["pass_at_k"].series
    assert curves["pass@k (unbiased estimator)|db test"] == {"x": [1, 2, 3, 4], "y": pytest.approx([0.75, 1, 1, 1])}
    assert curves["pass@k (unbiased estimator)|os test"]["y"] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    mix = plots["status_mix"].series
    names = mix["how episodes ended|ticks"]["labels"]
    assert names[0] == "alpha rollout (2)" and "beta rollout (3)" in names and "beta greedy v0 (20)" in names
    completed = dict(zip(names, mix["how episodes ended|completed"]["y"]))
    assert completed["alpha rollout (2)"] == pytest.approx(0.5) and completed["beta rollout (3)"] == pytest.approx(2 / 3)
    env = dict(zip(names, mix["how episodes ended|env_error"]["y"]))
    assert env["beta rollout (3)"] == pytest.approx(1 / 3) and env["beta greedy v0 (20)"] == 1.0


def test_markdown_summary(rendered):
    run, _, report, _ = rendered
    md = (run / "report" / "report.md").read_text()
    assert md == report.markdown and "finished" in md.splitlines()[2]
    assert "| tasks | ['alpha', 'beta'] |" in md and "| groups per task x group size | 2 x 4 |" in md
    lo, hi = wilson_interval(18, 20).lo, wilson_interval(18, 20).hi
    assert (f"| alpha | 0.200 (v0) → 0.900 [{lo:.2f}, {hi:.2f}] (v4, 20 ep.) | 0.100 (v0) → 0.700 [0.37, 0.90] "
            "(v4, 8 ep.) | 0.750 (step 4) | completed 8 |") in md
    assert "`weights/v4`: mean eval sampled success over tasks 0.840 (present)" in md
    assert "- wall time: 321 s" in md and "trainer idle after it: 12 s" in md
    # the last logged balance: trainer idle 0.25 (>= 0.2) while the rollout sat at the window 0.84 of its time
    assert ("- balance (last logged): trainer idle 0.25, rollout ranks at the staleness window 0.84 of their time: "
            "bound by the staleness window") in md
    assert "| **tiny model** (ours) | - | 75.0 ± " in md  # db's 4 runs: 1, 1, 0, 1
    series = json.loads((run / "report" / "plots" / "series.json").read_text())
    assert series["staleness"]["trajectories by staleness when trained on|trajectories"]["y"] == [25, 15, 1]
    for p in report.plots:
        assert p.path.is_file() and p.path.stat().st_size > 5000 and f"(plots/{p.name}.png)" in md


def test_a_run_in_progress_renders_and_says_what_is_missing(rendered, tmp_path):
    run, _, _, _ = rendered
    live = tmp_path / "live"
    shutil.copytree(run, live, ignore=shutil.ignore_patterns("summary.json", "eval*", "shards", "plots", "report.md"))
    data = load_run(live)
    report = write_report(data, live / "report")
    assert not data.finished and "in progress: 5 of 5 RL steps done" in report.markdown
    assert "summary.json: not written yet" in report.markdown and "no evaluation yet" in report.markdown
    assert "No evaluation yet." in report.markdown
    plots = {p.name: p for p in report.plots}
    assert plots["status_mix"].notes == ["how episodes ended: no rollout shards and no evaluations yet"]
    mon = Monitor(live / "tb", "status")  # no shards in this copy: the status mix comes from tb/
    for step, (done, limit) in enumerate([(0.5, 0.5), (1.0, 0.0)]):
        mon.scalars({"rollout/alpha/status/completed": done, "rollout/alpha/status/turn_limit": limit}, step)
    mon.close()
    mix = status_mix(load_run(live), tmp_path).series
    assert mix["how episodes ended|ticks"]["labels"] == ["alpha rollout, tb mean of 2 steps (2)"]
    assert mix["how episodes ended|completed"]["y"] == pytest.approx([0.75])
    assert mix["how episodes ended|turn_limit"]["y"] == pytest.approx([0.25])
    assert plots["task_curves"].series["rollout reward per task|alpha"]["y"] == pytest.approx(REWARD["alpha"])
    empty = write_report(load_run(tmp_path / "nothing-here"), tmp_path / "out")
    assert "config.yaml: missing" in empty.markdown and len(empty.plots) == 5  # no pass@k without results
