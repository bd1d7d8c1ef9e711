"""Per-task evaluation summaries: success over every episode (env errors as failures, as jobs.eval scores), the
env errors beside it, status mix, gain and its standard error."""
from __future__ import annotations

import math

import pytest

from agentrl.monitor.eval_summary import per_task_summary, status_mix, summary_lines, task_eval
from agentrl.types import Status, Trajectory


def traj(task: str, success: float, status: Status = Status.COMPLETED) -> Trajectory:
    return Trajectory("id", task, "test-0", "g", [1, 2], [0, 1], [0.0, -0.5], [-1, 0], [-1, 0], success, status, 1,
                      metrics={"success": success})


def test_task_eval_counts_env_errors_as_failures_and_reports_them() -> None:
    trajs = ([traj("a", 1.0)] * 3 + [traj("a", 0.0, Status.TURN_LIMIT)] + [traj("a", 0.0, Status.ENV_ERROR)] * 2
             + [traj("b", 0.0, Status.INVALID_ACTION)])
    ev = task_eval(trajs)
    assert ev["a"]["success"] == 0.5 and ev["a"]["episodes"] == 6  # 3 of 6: the two env errors are failures
    assert (ev["a"]["env_errors"], ev["a"]["env_error_rate"]) == (2, pytest.approx(2 / 6))
    assert ev["a"]["stderr"] == pytest.approx(math.sqrt(0.5 * 0.5 / 6))
    assert ev["a"]["status"] == {"completed": 3, "env_error": 2, "turn_limit": 1}
    assert ev["a"]["metrics"] == {"success": 0.75}  # the task's own metrics: over the episodes it finished
    assert ev["b"] == {"success": 0.0, "episodes": 1, "stderr": 0.0, "env_errors": 0, "env_error_rate": 0.0,
                       "status": {"invalid_action": 1}, "metrics": {"success": 0.0}}


def test_the_same_success_as_jobs_eval() -> None:
    from agentrl.evaluation.played import Played
    from agentrl.monitor.eval_results import aggregate

    trajs = [traj("a", 1.0)] * 3 + [traj("a", 0.0, Status.TURN_LIMIT)] + [traj("a", 0.0, Status.ENV_ERROR)] * 2
    eps = [Played.of_trajectory(t).scored("a", "test", f"test-{i}", 0) for i, t in enumerate(trajs)]
    r = aggregate(eps, ks=(1,))[("a", "test")]
    ev = task_eval(trajs)["a"]
    assert ev["success"] == pytest.approx(r.success.mean) and ev["env_error_rate"] == pytest.approx(r.env_error_rate)


def test_every_float_a_task_reports_is_averaged_per_task() -> None:
    from agentrl.monitor.rollout_stats import rollout_metrics

    a, b = traj("a", 1.0), traj("a", 0.0)
    a.metrics["read_note"], b.metrics["read_note"] = 1.0, 0.0
    b.metrics["steps_left"] = 3.0
    m = rollout_metrics([a, b])
    assert m["rollout/a/metrics/read_note"] == 0.5 and m["rollout/a/metrics/steps_left"] == 3.0
    assert "rollout/a/metrics/success" not in m  # reported once, as rollout/a/success
    assert task_eval([a, b])["a"]["metrics"] == {"read_note": 0.5, "steps_left": 3.0, "success": 0.5}


def test_a_task_whose_every_episode_failed_in_the_env_scores_zero_over_all() -> None:
    ev = task_eval([traj("a", 0.0, Status.ENV_ERROR)] * 3)
    assert (ev["a"]["episodes"], ev["a"]["env_errors"], ev["a"]["success"]) == (3, 3, 0.0)
    assert ev["a"]["status"] == {"env_error": 3} and ev["a"]["metrics"] == {}


def test_per_task_summary_gain_and_its_stderr() -> None:
    before = task_eval([traj("a", 1.0)] * 1 + [traj("a", 0.0)] * 3)
    after = task_eval([traj("a", 1.0)] * 3 + [traj("a", 0.0)] * 1)
    row = per_task_summary(before, after, before, after)["a"]
    assert (row["success_before_rl"], row["success_after_rl"]) == (0.25, 0.75)
    assert (row["sampled_success_before_rl"], row["sampled_success_after_rl"]) == (0.25, 0.75)
    assert row["sampled_gain"] == pytest.approx(0.5)
    se = math.sqrt(0.25 * 0.75 / 4)
    assert row["sampled_gain_stderr"] == pytest.approx(math.hypot(se, se))
    assert row["status"]["after_rl"] == {"completed": 4} and row["env_errors"] == 0
    no_sampled = per_task_summary(before, after, None, None)["a"]
    assert "sampled_success_after_rl" not in no_sampled


def test_summary_lines_explain_a_zero() -> None:
    ev = task_eval([traj("a", 0.0, Status.CONTEXT_LIMIT)] * 2 + [traj("a", 0.0, Status.ENV_ERROR)])
    lines = summary_lines({"per_task": per_task_summary(ev, ev, ev, ev)})
    assert lines == ["  a: greedy 0.000 -> 0.000, sampled 0.000 -> 0.000 (gain +0.000 +/- 0.000); "
                     "ended: context_limit 2, env_error 1"]
    assert status_mix({"turn_limit": 1, "completed": 2, "truncated": 0}) == "completed 2, turn_limit 1"
