"""The task tools a user runs from the shell: `jobs.check_task` and `jobs.show_trajectories`."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from agentrl.models import tiny_chat as chat
from agentrl.monitor.trajectory_text import spans
from agentrl.transport.shards import ShardWriter
from agentrl.types import Status, Trajectory
from jobs import check_task, show_trajectories

ROOT = Path(__file__).resolve().parents[1]

BROKEN = '''
class Broken:
    name = "broken"
    max_turns = 0          # the contract wants >= 1
    def tools(self): return []
    def indices(self, split): return []
    def start(self, index): raise KeyError(index)
'''


def test_check_task_passes_the_documented_example(capsys) -> None:
    assert check_task.main(["agentrl.envs.tasks.example:GuessTask", "--samples", "10"]) == 0
    out = capsys.readouterr().out
    assert "guess train: expert solved 10/10" in out and "meets the contract" in out


def test_check_task_names_the_broken_rule_of_a_users_task(tmp_path: Path) -> None:
    (tmp_path / "mytask.py").write_text(BROKEN)
    proc = subprocess.run([sys.executable, "-m", "jobs.check_task", "mytask:Broken"], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "breaks the contract" in proc.stderr and "max_turns must be an int >= 1" in proc.stderr


def test_check_task_reports_an_unimportable_task(capsys) -> None:
    assert check_task.main(["nowhere.mod:Nothing"]) == 2
    assert "cannot build task" in capsys.readouterr().err


def _traj(tok, status: Status, task: str, reward: float) -> Trajectory:
    prompt = tok.encode(chat.render([{"role": "user", "content": 'What is the "code" of "lema"?'}],
                                    add_generation_prompt=True), add_special_tokens=False)
    action = tok.encode('<tool_call>{"name": "submit_answer", "arguments": {"answer": "42"}}</tool_call><|im_end|>',
                        add_special_tokens=False)
    n, m = len(prompt), len(action)
    return Trajectory("t" + status.value, task, "test-1", "g", prompt + action, [0] * n + [1] * m,
                      [0.0] * n + [-0.1] * m, [-1] * n + [3] * m, [-1] * n + [0] * m, reward, status, 1,
                      metrics={"success": reward})


def test_show_trajectories_decodes_and_filters(tmp_path: Path, lookup_tokenizer, capsys) -> None:
    run = tmp_path / "run"
    lookup_tokenizer.save_pretrained(run / "model")
    ShardWriter(run / "shards" / "rollout-0").write(
        [_traj(lookup_tokenizer, Status.COMPLETED, "lookup", 1.0), _traj(lookup_tokenizer, Status.TURN_LIMIT, "lookup", 0.0)])
    ShardWriter(run / "shards" / "rollout-0").write([_traj(lookup_tokenizer, Status.COMPLETED, "unlock", 0.0)])
    assert show_trajectories.main([str(run), "--status", "turn_limit"]) == 0
    out = capsys.readouterr().out
    assert out.count("=== lookup test-1") == 1 and "status turn_limit" in out
    assert "--- policy v3, engine 0," in out and '"answer": "42"' in out and 'What is the "code" of "lema"?' in out
    assert show_trajectories.main([str(run), "-n", "5"]) == 0
    assert capsys.readouterr().out.count("\n=== reward") == 3  # all three, from both shards
    assert show_trajectories.main([str(run), "--task", "unlock", "-n", "5"]) == 0
    assert "=== unlock" in capsys.readouterr().out
    assert show_trajectories.main([str(run), "--status", "env_error"]) == 1


def test_segments_split_context_from_actions() -> None:
    t = Trajectory("x", "a", "i", "g", [1, 2, 3, 4, 5], [0, 1, 1, 0, 1], [0.0] * 5, [-1, 2, 2, -1, 3],
                   [-1, 0, 0, -1, 1], 0.0, Status.COMPLETED, 2)
    segs = [(g, ids.tolist(), v, e) for g, ids, v, e in spans(t)]
    assert segs == [(False, [1], -1, -1), (True, [2, 3], 2, 0), (False, [4], -1, -1), (True, [5], 3, 1)]
    assert np.array_equal(t.tokens, [1, 2, 3, 4, 5])
