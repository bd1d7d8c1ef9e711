"""BFCL multi-turn through `jobs.eval`'s path, graded by bfcl-eval's own checker (inside the `bfcl` task).

No model is needed: the `expert` target replays BFCL's ground truth (the env's and grader's ceiling), and a
policy that never calls a tool must fail every case. The task's own tests (tests/envs/test_bfcl.py) check
the checker case by case; here the evaluation around it: scope, players, results file, tables, and the
command itself through a real controller and env worker.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("bfcl_eval", reason="bfcl-eval is installed by install.sh (pip install --no-deps bfcl-eval)")

from agentrl.evaluation.endpoint import Reply  # noqa: E402
from agentrl.evaluation.evaluate import Settings, evaluate  # noqa: E402
from agentrl.evaluation.players import EndpointPlayer, ExpertPlayer  # noqa: E402
from agentrl.evaluation.runner import EvalScope, score  # noqa: E402
from agentrl.evaluation.targets import resolve  # noqa: E402
from agentrl.monitor.eval_results import ResultsFile, aggregate  # noqa: E402
from agentrl.monitor.eval_transcripts import read_transcripts  # noqa: E402
from agentrl.rollout.agent_loop import EpisodeLimits  # noqa: E402
from agentrl.rollout.collect import Retry  # noqa: E402
from agentrl.serving.inprocess import InProcessClient  # noqa: E402
from agentrl.tasks import get_task  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LIMITS = EpisodeLimits(max_turns=0, max_model_len=32768, max_new_tokens=512)
SETTINGS = Settings(temperature=0.0, top_p=1.0, limits=LIMITS, retry=Retry(max_retries=0))


@pytest.fixture(scope="module")
def client() -> InProcessClient:
    return InProcessClient({"bfcl": get_task("bfcl")})


class Silent:
    """A policy that answers every user turn in words, never calling a function."""

    async def reply(self, *a: object) -> Reply:
        return Reply({"role": "assistant", "content": "I cannot help with that."}, "stop", 10, 6)


def test_expert_target_through_evaluate(client: InProcessClient, tmp_path: Path) -> None:
    target = resolve("expert")
    assert target.expert and not target.is_endpoint and target.model_dir is None
    scope = EvalScope(("bfcl",), "test", samples=4, runs=1, concurrency=2)
    table = asyncio.run(evaluate(client, target, scope, SETTINGS, tmp_path, "eval-test-greedy"))
    assert table.splitlines()[2].split()[:5] == ["bfcl", "test", "4", "1", "100.0"]
    res = json.loads((tmp_path / "eval-test-greedy.json").read_text())["tasks"][0]
    assert res["episodes"] == 4 and res["success"]["mean"] == 1.0 and res["status"]["completed"] == 1.0
    lines = [json.loads(x) for x in (tmp_path / "eval-test-greedy.jsonl").read_text().splitlines()]
    assert sorted(x["index"] for x in lines) == [f"test-{i}" for i in range(4)]
    assert all(x["turns"] >= 2 and x["extra"]["reward"] == 1.0 for x in lines)  # calls, then a closing message
    for e in read_transcripts(tmp_path / "eval-test-greedy.transcripts.jsonl.gz"):  # what was said, per episode
        said = [m for m in e["messages"] if m["role"] == "assistant"]
        assert len(said) == e["turns"] and any(m.get("tool_calls") for m in said)
        assert any(m["role"] == "user" for m in e["messages"])  # BFCL's later user turns, as observations
        assert [m["role"] for m in e["prompt"]] == ["user"] and len(e["tools"]) >= 1
    assert not client.sessions  # every session ended (graded) or cancelled


def test_the_checker_decides(client: InProcessClient, tmp_path: Path) -> None:
    # test-173's ground truth breaks its own schema (a string ticket id): its replay fails bfcl-eval's check
    keys = [("bfcl", "test", i, 0) for i in ("test-0", "test-173")]
    with ResultsFile(tmp_path / "expert.jsonl") as rf:
        asyncio.run(score(ExpertPlayer(client, LIMITS, SETTINGS.retry), keys, rf, 2))
        expert = {e.index: e for e in rf.episodes}
    assert (expert["test-0"].success, expert["test-173"].success) == (1.0, 0.0)
    assert expert["test-173"].status == "completed"  # graded and failed: not an env error
    with ResultsFile(tmp_path / "silent.jsonl") as rf:
        player = EndpointPlayer(client, Silent(), 0.0, 1.0, LIMITS, SETTINGS.retry)
        asyncio.run(score(player, keys, rf, 2))
        silent = rf.episodes
    r = aggregate(silent, ks=(1,))[("bfcl", "test")]
    assert r.success.mean == 0.0 and r.status["completed"] == 1.0
    # one words-only message per user turn: test-0 has as many turns as its ground truth
    turns0 = len(get_task("bfcl").cases[0][1])
    assert {e.index: e.turns for e in silent}["test-0"] == turns0


def test_jobs_eval_bfcl_through_controller_and_worker(tmp_path: Path) -> None:
    out = tmp_path / "bfcl-eval"
    cmd = [sys.executable, "-m", "jobs.eval", "expert", "--tasks", "bfcl", "--samples", "3", "--greedy",
           "--workers", "1", "--out", str(out), "--progress", "lines"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "eval bfcl: 3/3 (100%) success 1.000 env_err 0" in p.stdout
    res = json.loads((out / "eval-test-greedy.json").read_text())["tasks"][0]
    assert (res["task"], res["episodes"], res["success"]["mean"]) == ("bfcl", 3, 1.0)
    assert (out / "logs").is_dir() and any((out / "logs").iterdir())  # the env roles ran as processes
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)  # resumed: nothing to play
    assert again.returncode == 0 and "all 3 episodes already scored" in again.stderr
