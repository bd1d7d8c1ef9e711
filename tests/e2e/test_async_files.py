"""The asynchronous pipeline in file-only mode (`transport.channel=files`): no MPI world, the trainer and each
rollout rank separate processes of the local launcher, trajectories as shard segments and notices as a file.

One run of the smoke preset with two rollout ranks; rollout rank 1 is SIGKILLed (found by pid through
/proc) after the first step. Checked: the launcher restarted that rank alone (the trainer process and rank 0
went on: same pids, one life each), the run finished all its steps, and the shards reconcile with the
trainer's ledger exactly once (nothing lost, nothing delivered or trained twice). About 2-3 minutes on 2
loaded cores (one extra engine start-up).
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
STEPS, RANKS, KILLED = 4, 2, 1


def _command(root: Path) -> list[str]:
    return [sys.executable, "-m", "jobs.train", "--preset", "smoke", f"run_root={root}", "name=files",
            "cluster.schedule=async", "transport.channel=files", f"cluster.rollout.ranks={RANKS}",
            "algo.max_staleness=1", f"trainer.steps={STEPS}", "rollout.env_latency_s=0.2", "rollout.eval_sampled=0",
            "rollout.eval_samples=4", "cluster.role_timeout_s=400", "cluster.max_restarts=2"]


def _steps_done(run_dir: Path) -> int:
    try:
        return int(json.loads((run_dir / "report" / "trainer.json").read_text())["steps_done"])
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return -1


def _pids(run_dir: Path, module: str, *extra: str) -> list[int]:
    """Processes running `python -m module --run-dir run_dir extra...` (their argv, read from /proc)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            words = [a.decode(errors="replace") for a in (p / "cmdline").read_bytes().split(b"\0")]
        except OSError:
            continue
        if module in words and str(run_dir) in words and all(e in words for e in extra):
            if not extra or words[words.index(extra[0]):][: len(extra)] == list(extra):
                out.append(int(p.name))
    return sorted(out)


def _shards_of(run_dir: Path, rank: int) -> list:
    d = run_dir / "shards" / f"rollout-{rank}"
    return ShardReader(d).available() if d.exists() else []


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("runs").resolve()
    run_dir = root / "files"
    log_path = root / "train.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(_command(root), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
        try:
            deadline = time.monotonic() + 400
            # after the first step, and once rank 1's first life has written a shard (under load rank 0 alone can
            # fill the first step): the kill then always cuts a life that delivered something
            while _steps_done(run_dir) < 1 or not _shards_of(run_dir, KILLED):
                assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before its first step"
                assert time.monotonic() < deadline, "no step, or no shard of rank 1, in 400 s"
                time.sleep(0.2)
            trainer = _pids(run_dir, "jobs.trainer")
            rank0 = _pids(run_dir, "jobs.rollout", "--rank", "0")
            victim = _pids(run_dir, "jobs.rollout", "--rank", str(KILLED))
            assert len(trainer) == len(rank0) == len(victim) == 1, (trainer, rank0, victim)
            killed_at = _steps_done(run_dir)
            os.kill(victim[0], signal.SIGKILL)
            while (rank1 := _pids(run_dir, "jobs.rollout", "--rank", str(KILLED))) in ([], victim):
                assert proc.poll() is None and time.monotonic() < deadline, "rank 1 was not started again"
                time.sleep(0.1)
            alive_after = {"trainer": _pids(run_dir, "jobs.trainer"),
                           "rank0": _pids(run_dir, "jobs.rollout", "--rank", "0")}
            rc = proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
    return {"run_dir": run_dir, "rc": rc, "log": log_path.read_text(), "trainer": trainer, "rank0": rank0,
            "victim": victim, "rank1_again": rank1, "alive_after": alive_after, "killed_at": killed_at,
            "wall_s": time.monotonic() - t0}


def test_only_the_killed_rank_was_restarted_and_the_run_finished(run: dict) -> None:
    log = run["log"]
    assert run["rc"] == 0, log[-4000:]
    assert "summary: held-out success" in log
    assert log.count("exited with") == 1 and f"rollout-{KILLED} exited with -9; restarting it" in log, log[-3000:]
    # the trainer and rank 0 kept their processes through the restart
    assert run["alive_after"] == {"trainer": run["trainer"], "rank0": run["rank0"]}
    assert run["rank1_again"] != run["victim"]
    run_dir = run["run_dir"]
    assert not (run_dir / "mpi").exists()  # no MPI handshake: nothing of the MPI channel ran
    summary = json.loads((run_dir / "report" / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["continued"] is False
    assert summary["role_restarts"] == {"trainer": 0, "rollout-0": 0, f"rollout-{KILLED}": 1}
    # one life of rank 0, two of rank 1 (its shard numbering and group ids went on from the first)
    assert (run_dir / "shards" / "rollout-0" / "incarnation").read_text() == "0"
    assert (run_dir / "shards" / f"rollout-{KILLED}" / "incarnation").read_text() == "1"
    trainer_log = (run_dir / "logs" / "trainer.log").read_text()
    assert trainer_log.count("warm start on") == 1 and "resumed from" not in trainer_log
    # the second life of rank 1 joined the same trainer and said bye: the trainer did not close without it
    assert "to close; going on without them" not in trainer_log  # channel.warn_not_closed
    assert (run_dir / "logs" / f"rollout-{KILLED}.log").read_text().count(f"rank {KILLED} stopped") == 1
    assert run["killed_at"] < STEPS
    print(f"killed after step {run['killed_at']}; whole run {run['wall_s']:.0f} s")


def test_shards_reconcile_with_the_ledger_exactly_once(run: dict) -> None:
    run_dir = run["run_dir"]
    trajs = [t for d in rank_dirs(run_dir, "rollout").values() for _, ts in ShardReader(d).scan() for t in ts]
    ids = [t.traj_id for t in trajs]
    for d in rank_dirs(run_dir, "rollout").values():  # numbering went on across the restart: no gap, no reuse
        seqs = [int(p.name.removesuffix(".h5")) for p in ShardReader(d).available()]
        assert seqs == list(range(len(seqs)))
    assert len(ids) == len(set(ids)) and ids
    assert {t.group_id.split("-")[0] for t in trajs} >= {"r0i0", f"r{KILLED}i0"}
    assert max(Counter(t.group_id for t in trajs).values()) <= 4  # no group of the dead life mixed into a new one
    ledger = json.loads((run_dir / "report" / "ledger.json").read_text())
    consumed_list = ledger["consumed"]
    consumed, excluded, held = set(consumed_list), set(ledger["excluded"]), set(ledger["held_at_end"])
    assert len(consumed_list) == len(consumed)
    assert not (consumed & excluded) and not (consumed & held) and not (excluded & held)
    assert consumed | excluded | held == set(ids)  # nothing lost silently, nothing invented
    trainer = json.loads((run_dir / "report" / "trainer.json").read_text())
    assert trainer["steps_done"] == STEPS
    # the smoke preset keeps uniform groups: every consumed trajectory was trained on, once
    assert trainer["trajectories_trained"] == len(consumed) == STEPS * 2 * 4
    assert trainer["queue"].get("duplicate", 0) == 0  # no segment was read twice
    assert trainer["left_at_end/held"] == len(held)
