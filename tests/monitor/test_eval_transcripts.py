"""The evaluation's transcripts file (shared values once, interrupted writes, replayed episodes) and its
printer (`jobs.show_trajectories` on an evaluation: filters, cut and full observations)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from agentrl.monitor.eval_results import ScoredEpisode
from agentrl.monitor.eval_transcripts import TranscriptFile, read_transcripts, transcripts_path
from agentrl.monitor.trajectory_text import render_transcript
from tests.job_cli import run_job

SYSTEM = {"role": "system", "content": "You are a database agent. " * 20}  # long: written once
TOOLS = [{"type": "function", "function": {"name": "execute_sql", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "commit_final_answer", "parameters": {"type": "object"}}}]


def _ep(task: str, index: str, sample: int, status: str = "completed", success: float = 1.0,
        reward: float | None = None) -> ScoredEpisode:
    return ScoredEpisode(task, "test", index, sample, success, success, status, turns=2,
                         extra={"reward": success if reward is None else reward, "context_tokens": 9})


def _conversation(answer: str, rows: str = "[(1,)]") -> list[dict]:
    call = {"id": "c1", "type": "function", "function": {"name": "execute_sql", "arguments": '{"sql": "SELECT 1"}'}}
    return [{"role": "assistant", "content": "I will query.", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "name": "execute_sql", "content": rows},
            {"role": "assistant", "content": answer}]


def _write(tf: TranscriptFile, ep: ScoredEpisode, answer: str = "1", rows: str = "[(1,)]") -> None:
    tf.append(ep, [SYSTEM, {"role": "user", "content": f"question {ep.index}"}], _conversation(answer, rows), TOOLS)


def _raw_lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in gzip.decompress(path.read_bytes()).decode().splitlines()]


def test_shared_values_once_and_resolved_on_reading(tmp_path: Path) -> None:
    path = transcripts_path(tmp_path / "eval-test.jsonl")
    assert path.name == "eval-test.transcripts.jsonl.gz"
    with TranscriptFile(path) as tf:
        _write(tf, _ep("db", "test-0", 0))
        _write(tf, _ep("db", "test-1", 0))
    with TranscriptFile(path) as tf:  # reopened (a rerun): it knows what is written
        _write(tf, _ep("db", "test-2", 0))
    lines = _raw_lines(path)
    assert sum("shared" in x for x in lines) == 2  # the system prompt and the tools, for three episodes
    episodes = [x for x in lines if "shared" not in x]
    assert episodes[2]["prompt"][0] == episodes[0]["prompt"][0] and set(episodes[2]["prompt"][0]) == {"shared"}
    assert episodes[0]["prompt"][1] == {"role": "user", "content": "question test-0"}  # short: inline
    got = read_transcripts(path)
    assert [e["index"] for e in got] == ["test-0", "test-1", "test-2"]
    assert all(e["prompt"][0] == SYSTEM and e["tools"] == TOOLS for e in got)
    assert got[1]["messages"] == _conversation("1") and got[1]["reward"] == 1.0 and got[1]["turns"] == 2


def test_an_interrupted_file_reads_and_resumes(tmp_path: Path) -> None:
    path = tmp_path / "e.transcripts.jsonl.gz"
    with TranscriptFile(path) as tf:
        _write(tf, _ep("db", "test-0", 0))
        _write(tf, _ep("db", "test-1", 0, "turn_limit", 0.0), answer="first try")
    whole = path.stat().st_size
    cut = gzip.compress(b'{"task": "db", "split": "test", "index": "test-2", "sample": 0}\n' * 50)
    with open(path, "ab") as f:
        f.write(cut[: len(cut) // 2])  # a kill in the middle of an episode's write
    assert [e["index"] for e in read_transcripts(path)] == ["test-0", "test-1"]
    with TranscriptFile(path) as tf:
        assert path.stat().st_size == whole  # the member cut short is dropped before appending
        # test-1's transcript was written but its results line was not: the rerun plays it again
        _write(tf, _ep("db", "test-1", 0, "completed", 1.0), answer="second try")
        _write(tf, _ep("db", "test-2", 0))
    got = {e["index"]: e for e in read_transcripts(path)}
    assert sorted(got) == ["test-0", "test-1", "test-2"]
    assert got["test-1"]["messages"][-1]["content"] == "second try" and got["test-1"]["status"] == "completed"
    assert [e["index"] for e in read_transcripts(path)] == ["test-0", "test-1", "test-2"]  # the last one's place
    assert read_transcripts(tmp_path / "missing.transcripts.jsonl.gz") == []


def test_render_cuts_observations_unless_full() -> None:
    e = read_like(_ep("db", "test-3", 1, "turn_limit", 0.0), rows="x" * 1000)
    e["messages"] += [{"role": "assistant", "content": "", "raw": '<tool_call>{"name": ', "finish": "length"},
                      {"role": "tool", "content": "Error: the tool call is not valid JSON", "by": "loop"}]
    text = render_transcript(e, width=100, prompt_width=50)
    lines = text.splitlines()
    assert lines[0] == "=== db test-3 (split test, sample 1)" and lines[1] == "tools: execute_sql, commit_final_answer"
    assert lines[2].startswith("[system] You are a database agent.") and "more chars]" in lines[2]
    assert '-> execute_sql({"sql": "SELECT 1"})' in lines
    assert f"[tool execute_sql] {'x' * 100}... [900 more chars]" in lines
    assert "--- assistant (cut off at the token limit):" in lines
    assert '[its calls could not be read; raw text:]' in lines and '<tool_call>{"name":' in lines
    assert "[tool, from the loop] Error: the tool call is not valid JSON" in lines
    assert lines[-1] == "=== turn_limit, success 0, score 0, reward 0, 2 turns"
    full = render_transcript(e, width=None, prompt_width=None)
    assert f"[tool execute_sql] {'x' * 1000}" in full.splitlines() and SYSTEM["content"].rstrip() in full


def read_like(ep: ScoredEpisode, rows: str) -> dict:
    return {"task": ep.task, "split": ep.split, "index": ep.index, "sample": ep.sample, "status": ep.status,
            "success": ep.success, "score": ep.score, "reward": ep.extra["reward"], "turns": ep.turns,
            "tools": TOOLS, "prompt": [SYSTEM], "messages": _conversation("1", rows)}


@pytest.fixture
def evaluation(tmp_path: Path) -> Path:
    """An evaluation directory: db and os, two runs each, some failures, one with a partial reward."""
    with TranscriptFile(tmp_path / "eval-test.transcripts.jsonl.gz") as tf:
        for sample in (0, 1):
            _write(tf, _ep("db", "test-0", sample))
            _write(tf, _ep("db", "test-1", sample, "turn_limit", 0.0))
            _write(tf, _ep("os", "test-0", sample, "invalid_action", 0.0, reward=0.25))
    (tmp_path / "eval-test.jsonl").write_text("")
    return tmp_path


def _shown(*argv: str) -> list[tuple[str, str, str]]:
    """(task, index, sample) of every episode the command printed."""
    run = run_job("show_trajectories", *argv, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    heads = [ln.split() for ln in run.stdout.splitlines() if ln.startswith("=== ") and "(split" in ln]
    return [(h[1], h[2], h[6].rstrip(")")) for h in heads]


@pytest.mark.parametrize("args,want", [
    (["--limit", "2"], [("db", "test-0", "0"), ("db", "test-1", "0")]),
    (["--task", "os", "-n", "0"], [("os", "test-0", "0"), ("os", "test-0", "1")]),
    (["--status", "turn_limit", "--sample", "1"], [("db", "test-1", "1")]),
    (["--failed", "--task", "db"], [("db", "test-1", "0"), ("db", "test-1", "1")]),
    (["--success", "-n", "0"], [("db", "test-0", "0"), ("db", "test-0", "1")]),
    (["--min-reward", "0.2", "--max-reward", "0.5", "--index", "test-0"], [("os", "test-0", "0"), ("os", "test-0", "1")]),
])
def test_show_trajectories_filters_an_evaluation(evaluation: Path, args: list[str], want: list) -> None:
    assert _shown(str(evaluation), *args) == want
    assert _shown(str(evaluation / "eval-test.jsonl"), *args) == want  # the results file names it too


def test_show_trajectories_on_nothing_to_show(evaluation: Path, tmp_path_factory) -> None:
    run = run_job("show_trajectories", str(evaluation), "--task", "kg", timeout=120)
    assert run.returncode == 1 and "no episode" in run.stderr
    empty = tmp_path_factory.mktemp("empty")
    run = run_job("show_trajectories", str(empty), timeout=120)
    assert run.returncode == 2 and "neither a run directory" in run.stderr
