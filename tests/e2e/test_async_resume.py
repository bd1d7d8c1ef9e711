"""Whole-run restarts of the asynchronous pipeline, with real processes killed by pid.

One run of the smoke preset (2 rollout ranks, a checkpoint every step) is hit three times:
  1. the trainer is SIGKILLed mid-run: the MPI world dies, the launcher starts it again, the trainer resumes
     from its newest checkpoint and drains the shards, the rollout ranks resume (a new incarnation);
  2. a rollout rank is SIGKILLed: the same, again;
  3. `python -m jobs.train` itself gets SIGTERM (every role stopped), and the same command is run again:
     it continues the run to the end instead of replacing it.
Then the shards are reconciled against the trainer's ledger: every trajectory written is in exactly one of
consumed / excluded (with a reason) / held, none was consumed twice, and the step counter ends at the
configured number of steps. Several minutes on 2 cores (three engine start-ups per rank).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from agentrl.transport.shards import ShardReader, rank_dirs

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e
STEPS, RANKS = 9, 2


def _command(root: Path) -> list[str]:
    return [sys.executable, "-m", "jobs.train", "--preset", "smoke", f"run_root={root}", "name=resume",
            "cluster.schedule=async", f"cluster.rollout.ranks={RANKS}", "algo.max_staleness=1",
            f"trainer.steps={STEPS}", "trainer.checkpoint_every=1", "rollout.env_latency_s=0.2",
            "rollout.eval_sampled=0", "rollout.eval_samples=4", "cluster.role_timeout_s=400",
            "cluster.max_restarts=2"]


def _steps_done(run_dir: Path) -> int:
    try:
        return int(json.loads((run_dir / "report" / "trainer.json").read_text())["steps_done"])
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return -1


def _wait_steps(run_dir: Path, proc: subprocess.Popen, at_least: int, timeout_s: float = 400) -> None:
    deadline = time.monotonic() + timeout_s
    while _steps_done(run_dir) < at_least:
        assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before step {at_least}"
        assert time.monotonic() < deadline, f"step {at_least} not reached in {timeout_s:.0f}s"
        time.sleep(0.2)


def _pids(module: str, run_dir: Path) -> list[int]:
    """Python processes running `-m module --run-dir run_dir` (not mpiexec, which only names them)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        if module in words and str(run_dir) in words and "mpiexec" not in Path(words[0]).name:
            out.append(int(p.name))
    return sorted(out)


def _kill(module: str, run_dir: Path, which: int = 0) -> int:
    deadline = time.monotonic() + 60
    while not (pids := _pids(module, run_dir)):
        assert time.monotonic() < deadline, f"no {module} process for {run_dir}"
        time.sleep(0.2)
    pid = pids[which % len(pids)]
    os.kill(pid, signal.SIGKILL)
    return pid


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("runs")
    run_dir = root / "resume"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log1 = open(root / "first.log", "w")
    first = subprocess.Popen(_command(root), cwd=ROOT, stdout=log1, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        _wait_steps(run_dir, first, 2)
        _kill("jobs.trainer", run_dir)
        before_second = _steps_done(run_dir)
        _wait_steps(run_dir, first, before_second + 2)  # the restarted world trains again
        _kill("jobs.rollout", run_dir, which=1)
        _wait_steps(run_dir, first, 6)
        interrupted_at = _steps_done(run_dir)
        ledger_at_interrupt = json.loads((run_dir / "report" / "trainer.json").read_text())
        first.send_signal(signal.SIGTERM)
        rc1 = first.wait(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
        log1.close()
    second = subprocess.run(_command(root), cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    return {"run_dir": run_dir, "first_log": (root / "first.log").read_text(), "rc1": rc1, "second": second,
            "interrupted_at": interrupted_at, "trainer_at_interrupt": ledger_at_interrupt}


def test_the_launcher_restarted_the_pipeline_twice(resumed: dict) -> None:
    log = resumed["first_log"]
    assert log.count("pipeline exited with") == 2, log[-3000:]
    assert resumed["rc1"] != 0  # stopped by SIGTERM, not finished
    assert resumed["interrupted_at"] < STEPS


def test_the_same_command_continues_the_run(resumed: dict) -> None:
    second = resumed["second"]
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "continuing the run in" in second.stdout and "replacing" not in second.stdout
    run_dir = resumed["run_dir"]
    summary = json.loads((run_dir / "report" / "summary.json").read_text())
    assert summary["continued"] is True and summary["steps"] == STEPS
    # the before-RL evaluation is the first life's, not a re-evaluation of trained weights
    before = json.loads((run_dir / "report" / "before_rl.json").read_text())
    assert before["version"] == 0 and summary["success_before_rl"] == before["before"]["eval/success"]
    # four lives per rank: started, restarted twice by the launcher, continued once
    for r in range(RANKS):
        assert (run_dir / "shards" / f"rollout-{r}" / "incarnation").read_text() == "3"


def test_shards_reconcile_with_the_ledger_after_restarts(resumed: dict) -> None:
    run_dir = resumed["run_dir"]
    trajs = [t for d in rank_dirs(run_dir, "rollout").values() for _, ts in ShardReader(d).scan() for t in ts]
    ids = [t.traj_id for t in trajs]
    assert len(ids) == len(set(ids))  # shard numbering went on: nothing overwritten, nothing written twice
    groups = Counter(t.group_id for t in trajs)
    assert max(groups.values()) <= 4  # no group of one life mixed with a group of another
    ledger = json.loads((run_dir / "report" / "ledger.json").read_text())
    consumed_list = ledger["consumed"]
    consumed, excluded, held = set(consumed_list), set(ledger["excluded"]), set(ledger["held_at_end"])
    assert len(consumed_list) == len(consumed)  # nothing trained twice
    assert not (consumed & excluded) and not (consumed & held) and not (excluded & held)
    assert consumed | excluded | held == set(ids)  # nothing lost silently, nothing invented
    trainer = json.loads((run_dir / "report" / "trainer.json").read_text())
    assert trainer["steps_done"] == STEPS
    assert trainer["trajectories_trained"] == len(consumed)
    # what the first invocation had trained when it was stopped is still in the ledger (its checkpoint's)
    assert trainer["trajectories_trained"] > resumed["trainer_at_interrupt"]["trajectories_trained"] > 0
    reasons = Counter(ledger["excluded"].values())
    assert set(reasons) <= {"stale", "env_error", "cancelled", "group_timeout", "late", "orphaned"}
