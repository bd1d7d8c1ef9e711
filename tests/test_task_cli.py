"""The task tools a user runs from the shell: `jobs.check_task` and `jobs.show_trajectories`."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from agentrl.models import tiny_chat as chat
from agentrl.monitor.trajectory_text import pick_latest, render_plain, run_tokenizer, shard_dirs, spans
from agentrl.transport.shards import ShardReader, ShardWriter, read_shard
from agentrl.types import Status, Trajectory

ROOT = Path(__file__).resolve().parents[1]

BROKEN = '''
class Broken:
    name = "broken"
    max_turns = 0          # the contract wants >= 1
    def tools(self): return []
    def indices(self, split): return []
    def start(self, index): raise KeyError(index)
'''


def _cli(*argv: str, pythonpath: str = str(ROOT)) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": pythonpath}, timeout=120)


def test_check_task_passes_the_documented_example() -> None:
    proc = _cli("jobs.check_task", "agentrl.tasks.example:GuessTask", "--samples", "10")
    assert proc.returncode == 0, proc.stderr
    assert "guess train: expert solved 10/10" in proc.stdout and "meets the contract" in proc.stdout


def test_check_task_names_the_broken_rule_of_a_users_task(tmp_path: Path) -> None:
    (tmp_path / "mytask.py").write_text(BROKEN)
    proc = _cli("jobs.check_task", "mytask:Broken", pythonpath=f"{tmp_path}{os.pathsep}{ROOT}")
    assert proc.returncode == 1, proc.stderr
    assert "breaks the contract" in proc.stderr and "max_turns must be an int >= 1" in proc.stderr


def test_check_task_reports_an_unimportable_task() -> None:
    proc = _cli("jobs.check_task", "nowhere.mod:Nothing")
    assert proc.returncode == 2 and "cannot build task" in proc.stderr


def _traj(tok, status: Status, task: str, reward: float) -> Trajectory:
    prompt = tok.encode(chat.render([{"role": "user", "content": 'What is the "code" of "lema"?'}],
                                    add_generation_prompt=True), add_special_tokens=False)
    action = tok.encode('<tool_call>{"name": "submit_answer", "arguments": {"answer": "42"}}</tool_call><|im_end|>',
                        add_special_tokens=False)
    n, m = len(prompt), len(action)
    return Trajectory("t" + status.value, task, "test-1", "g", prompt + action, [0] * n + [1] * m,
                      [0.0] * n + [-0.1] * m, [-1] * n + [3] * m, [-1] * n + [0] * m, reward, status, 1,
                      metrics={"success": reward})


def test_show_trajectories_decodes_and_filters(tmp_path: Path, lookup_tokenizer) -> None:
    run = tmp_path / "run"
    lookup_tokenizer.save_pretrained(run / "model")
    ShardWriter(run / "shards" / "rollout-0").write(
        [_traj(lookup_tokenizer, Status.COMPLETED, "lookup", 1.0), _traj(lookup_tokenizer, Status.TURN_LIMIT, "lookup", 0.0)])
    ShardWriter(run / "shards" / "rollout-0").write([_traj(lookup_tokenizer, Status.COMPLETED, "unlock", 0.0)])
    shards = [p for d in shard_dirs(run) for p in ShardReader(d).available()]
    assert len(shards) == 2

    def pick(n: int, task: str | None = None, status: str | None = None) -> list[Trajectory]:
        return pick_latest(shards, read_shard, n, task, status)

    assert [(t.task, t.status) for t in pick(5)] == [("lookup", Status.COMPLETED), ("lookup", Status.TURN_LIMIT),
                                                     ("unlock", Status.COMPLETED)]  # oldest shard first
    assert [t.task for t in pick(1)] == ["unlock"] and pick(0) == []
    assert [t.task for t in pick(5, task="unlock")] == ["unlock"] and pick(3, status="env_error") == []
    (turn_limit,) = pick(5, status="turn_limit")
    text = render_plain(turn_limit, run_tokenizer(run))  # the run's own tokenizer, as the command loads it
    assert text == render_plain(turn_limit, lookup_tokenizer)
    assert text.count("=== lookup test-1") == 1 and "status turn_limit" in text
    assert "--- policy v3, engine 0," in text and '"answer": "42"' in text and 'What is the "code" of "lema"?' in text
    # the command's exits that load no tokenizer (one that prints would import transformers anew: seconds)
    assert _cli("jobs.show_trajectories", str(run), "--status", "env_error").returncode == 1
    assert _cli("jobs.show_trajectories", str(tmp_path)).returncode == 2  # no shards/: not a run directory


def test_segments_split_context_from_actions() -> None:
    t = Trajectory("x", "a", "i", "g", [1, 2, 3, 4, 5], [0, 1, 1, 0, 1], [0.0] * 5, [-1, 2, 2, -1, 3],
                   [-1, 0, 0, -1, 1], 0.0, Status.COMPLETED, 2)
    segs = [(g, ids.tolist(), v, e) for g, ids, v, e in spans(t)]
    assert segs == [(False, [1], -1, -1), (True, [2, 3], 2, 0), (False, [4], -1, -1), (True, [5], 3, 1)]
    assert np.array_equal(t.tokens, [1, 2, 3, 4, 5])
