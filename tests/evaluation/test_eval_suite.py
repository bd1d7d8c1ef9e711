"""`python -m jobs.eval_suite`: one target on the paper's evaluation families, one table.

The scripted experts play two indices of each family in this process (AgentBench's families on a fixture checkout
in AgentBench's layout; db on sqlite here, MariaDB being the suite's own default, run by hand: docs/report.md
section 5): suite.json and suite.md, the Wilson intervals, the paper's rows, a rerun that reuses every family and
`--fresh` that replays them, a budget spent before the first family. A budget that runs out inside a family is
checked through the library, with an env slow enough to be cut: the episodes left are counted as unfinished, and
the same suite without a budget scores exactly them.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from agentrl.evaluation import suite, suite_plan, suite_table
from agentrl.evaluation.evaluate import Settings
from agentrl.evaluation.targets import resolve
from agentrl.monitor.eval_results import read_results
from agentrl.monitor.eval_stats import wilson_interval
from agentrl.rollout.agent_loop import EpisodeLimits
from agentrl.rollout.collect import Retry
from agentrl.serving.inprocess import InProcessClient
from agentrl.tasks import get_task
from tests.envs.agentbench_checkout import build_checkout
from tests.envs.os_fixtures import agentbench_checkout as os_checkout
from tests.envs.sandbox_helpers import missing_sandbox
from tests.job_cli import run_job

FAMILIES = ["db", "os", "kg", "alfworld", "webshop", "bfcl"]


@pytest.fixture(scope="module")
def checkouts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("agentbench")
    return {"main": build_checkout(root / "main"), "os": os_checkout(root / "os")}


@pytest.fixture
def checkout_env(checkouts: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    monkeypatch.setenv("AGENTRL_AGENTBENCH_DIR", str(checkouts["main"]))  # the job's (run_job's env is ours)
    return checkouts


def _suite(out: Path, checkouts: dict[str, Path], *extra: str) -> Any:
    families = [f for f in FAMILIES if f != "os" or missing_sandbox() is None or os.environ.get("CI")]
    return run_job("eval_suite", "expert", "--families", ",".join(families), "--samples", "2", "--inprocess",
                   "--task-option", "db.backend=sqlite", "--task-option", f"os.agentbench_dir={checkouts['os']}",
                   "--out", str(out), "--progress", "lines", *extra, timeout=300)


def _sessions(out: Path, family: str, stem: str) -> list[dict[str, Any]]:
    return json.loads((out / family / f"{stem}.suite.json").read_text())["sessions"]


def test_the_experts_suite_its_table_reuse_and_fresh(tmp_path: Path, checkout_env: dict[str, Path]) -> None:
    checkouts = checkout_env
    out = tmp_path / "suite"
    dry = _suite(out, checkouts, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "db dev greedy: 2 episodes x 15 turns x" in dry.stdout and not (out / "suite.json").exists()

    p = _suite(out, checkouts, "--sampled-runs", "2")
    assert p.returncode == 0, p.stderr[-3000:]
    s = json.loads((out / "suite.json").read_text())
    fams = s["families"]
    assert list(fams)[:1] == ["db"] and "bfcl" in fams and len(fams) >= 5
    assert s["partial"] and "first 2 indices" in s["partial_reason"]  # --samples: never a whole-split table
    assert [m["name"] for m in s["modes"]] == ["greedy", "sampled"]
    for name, d in fams.items():
        assert "error" not in d, (name, d)
        assert d["max_turns"] > 0 and d["max_new_tokens"] > 0
        for mode, episodes in (("greedy", 2), ("sampled", 4)):
            r = d[mode]
            assert (r["planned"], r["episodes"], r["unfinished"]) == (episodes, episodes, 0), (name, mode)
            eps = [e for e in read_results(r["results"])]
            ok = sum(e.success > 0.5 for e in eps)
            iv = wilson_interval(ok, len(eps))
            assert r["successes"] == ok and r["success"] == pytest.approx(ok / len(eps))
            assert r["wilson"] == pytest.approx([iv.lo, iv.hi])
            assert r["stderr"] == pytest.approx(math.sqrt(r["success"] * (1 - r["success"]) / len(eps)))
            assert sum(r["status"].values()) == episodes and r["bounds"] is not None
            assert r["worst_case"]["tokens"] == episodes * d["max_turns"] * d["max_new_tokens"]
            assert r["sessions"] == 1 and r["wall_s"] >= 0
        assert "t_interval_over_runs" in d["sampled"]
    assert fams["bfcl"]["max_model_len"] >= suite_plan.BFCL_CONTEXT > fams["kg"]["max_model_len"]
    assert fams["kg"]["greedy"]["success"] == 1.0  # the generated splits' experts solve them
    md = (out / "suite.md").read_text()
    assert "AgentRL Qwen2.5-7B (paper) | 91.5 | 63.7 | 57.8 | 40.8 | 56.1 | 62.0 | - |" in md
    assert "**scripted expert** greedy (ours)" in md and "Scale: the tasks' scripted experts" in md
    assert "7B-32B" in md and "**Partial**" in md and "python -m jobs.eval_suite expert" in md
    # each family's files are jobs.eval's (its tables, transcripts, fingerprint)
    assert (out / "db" / "eval-dev-greedy.md").exists() and (out / "db" / "eval-dev-greedy.meta.json").exists()
    assert (out / "kg" / "eval-test.transcripts.jsonl.gz").exists()

    again = _suite(out, checkouts, "--sampled-runs", "2")  # every family reused, nothing played
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("already scored") == 2 * len(fams)
    s2 = json.loads((out / "suite.json").read_text())
    for name in fams:
        assert s2["families"][name]["greedy"]["success"] == fams[name]["greedy"]["success"]
        assert s2["families"][name]["greedy"]["sessions"] == 1

    first = _sessions(out, "kg", "eval-test-greedy")[0]["started"]
    fresh = _suite(out, checkouts, "--fresh")  # greedy only: its files replayed (the sampled ones stay)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert "already scored" not in fresh.stdout
    kg = _sessions(out, "kg", "eval-test-greedy")
    assert len(kg) == 1 and kg[0]["started"] > first
    assert [m["name"] for m in json.loads((out / "suite.json").read_text())["modes"]] == ["greedy"]


def test_a_budget_spent_before_any_family_leaves_every_episode_unfinished(tmp_path: Path,
                                                                         checkout_env: dict[str, Path]) -> None:
    checkouts = checkout_env
    out = tmp_path / "suite"
    p = _suite(out, checkouts, "--budget-min", "0.00001")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "not started, the budget is spent" in p.stdout
    s = json.loads((out / "suite.json").read_text())
    assert s["partial"] and "budget ran out" in s["partial_reason"] and s["budget_min"] == pytest.approx(1e-5)
    for d in s["families"].values():
        r = d["greedy"]
        assert (r["episodes"], r["unfinished"], r["status"]) == (0, 2, {"unfinished": 2})
        assert r["success"] is None and r["bounds"] == [0.0, 1.0]
    assert "| unfinished |" in (out / "suite.md").read_text()


class SlowClient(InProcessClient):
    """lookup in this process, each env step taking `delay_s`: a budget of a second cuts a family in the middle."""

    def __init__(self, delay_s: float) -> None:
        super().__init__({"lookup": get_task("lookup")})
        self.delay_s = delay_s

    async def interact(self, session_id: str, message: dict[str, Any]) -> Any:
        await asyncio.sleep(self.delay_s)
        return await super().interact(session_id, message)


def test_a_budget_that_runs_out_inside_a_family_counts_the_rest_unfinished(tmp_path: Path) -> None:
    target = resolve("expert")
    settings = Settings(0.0, 1.0, EpisodeLimits(0, 1024, 32), Retry(max_retries=0))
    family = suite_plan.Family("lookup", "test")
    spec = suite_plan.SuiteSpec((family,), samples=12, budget_s=1.0, concurrency=1)
    client = SlowClient(0.1)  # two turns an episode: ~0.2 s each, one at a time

    async def go(spec: suite_plan.SuiteSpec) -> tuple[list[suite_plan.FamilyPlan], dict[str, Any]]:
        plans = await suite_plan.plan(client, spec, settings.limits)
        return plans, await suite.run_suite(client, target, spec, settings, tmp_path, plans, False, lambda _: None)

    plans, done = asyncio.run(go(spec))
    assert done["stopped"] == "lookup greedy"
    s = suite_table.summarize(target, spec, plans, tmp_path, label="x", scale="", command="", wall_s=1.0, engine_s=0.0,
                              stopped=done["stopped"])
    r = s["families"]["lookup"]["greedy"]
    assert s["partial"] and 0 < r["episodes"] < 12 and r["episodes"] + r["unfinished"] == 12
    assert r["status"]["unfinished"] == r["unfinished"] and r["success"] == 1.0  # never counted as failures
    assert r["bounds"] == [pytest.approx(r["episodes"] / 12), 1.0]
    sessions = _sessions(tmp_path, "lookup", "eval-test-greedy")
    assert [x["stopped"] for x in sessions] == ["budget"] and sessions[0]["scored"] == r["episodes"]
    assert 0.9 < sessions[0]["wall_s"] < 3
    md = suite_table.markdown(s)
    assert f"{r['episodes']} of 12" in md and f"unfinished {r['unfinished']}" in md

    unbounded = suite_plan.SuiteSpec((family,), samples=12, concurrency=4)  # the same suite goes on without a budget
    plans, done = asyncio.run(go(unbounded))
    assert not done["stopped"]
    s = suite_table.summarize(target, unbounded, plans, tmp_path, label="x", scale="", command="", wall_s=1.0,
                              engine_s=0.0)
    r2 = s["families"]["lookup"]["greedy"]
    assert (r2["episodes"], r2["unfinished"], r2["successes"]) == (12, 0, 12)
    assert s["partial_reason"] == "the first 12 indices of each split only"  # the budget no longer
    sessions = _sessions(tmp_path, "lookup", "eval-test-greedy")
    assert len(sessions) == 2 and sessions[1]["scored"] == 12 - r["episodes"]
    assert r2["wall_s"] == pytest.approx(sum(x["wall_s"] for x in sessions), abs=0.1)


def test_a_local_model_plays_every_family_and_mode_on_one_engine(lookup_format, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A local target: one engine for the suite, opened with its longest context and concurrency, each family and
    mode played in the model's format under its own limits; a context that cannot hold a family's first prompts
    leaves that family unplayed, with the reason, and the others played."""
    from agentrl.evaluation.targets import Target
    from agentrl.rollout.engine import ExpertEngine

    client = InProcessClient({"lookup": get_task("lookup"), "unlock": get_task("unlock")})
    opened: list[tuple[int, int]] = []

    @contextlib.asynccontextmanager
    async def engine(target: Any, settings: Settings, concurrency: int, fmt: Any = None) -> Any:
        opened.append((settings.limits.max_model_len, concurrency))
        yield ExpertEngine(client), lookup_format

    monkeypatch.setattr(suite, "local_model", engine)
    monkeypatch.setattr(suite, "load_format", lambda target, settings: lookup_format)
    target = Target("tiny", model_dir=tmp_path / "model")
    families = (suite_plan.Family("lookup", "test"), suite_plan.Family("unlock", "test"))

    said: list[str] = []

    def play(context: int, out: Path) -> dict[str, Any]:
        settings = Settings(0.0, 1.0, EpisodeLimits(0, context, 48), Retry(max_retries=0))
        spec = suite_plan.SuiteSpec(families, samples=3, sampled_runs=2, concurrency=3)

        async def go() -> list[suite_plan.FamilyPlan]:
            plans = await suite_plan.plan(client, spec, settings.limits)
            await suite.run_suite(client, target, spec, settings, out, plans, False, said.append)
            return plans

        plans = asyncio.run(go())
        return suite_table.summarize(target, spec, plans, out, label="tiny", scale="", command="", wall_s=1.0,
                                     engine_s=0.0)

    s = play(1024, tmp_path / "fits")
    assert opened == [(1024, 3)]  # one engine for both families and both modes
    for name in ("lookup", "unlock"):
        fam = s["families"][name]
        assert fam["max_model_len"] == 1024 and fam["greedy"]["episodes"] == 3 and fam["sampled"]["episodes"] == 6
        assert fam["greedy"]["tokens"] > 0  # the expert's tokens, in the model's format
    assert s["families"]["lookup"]["greedy"]["success"] == 1.0
    # after the first family, each one's worst case is also put in minutes at the rate measured so far
    assert "tokens/s" not in said[0] and all("tokens/s this command measured so far" in x for x in said[1:])

    opened.clear()
    s = play(40, tmp_path / "too-short")  # no first prompt fits 40 tokens
    assert opened == [] and all("cannot hold the first prompt" in d["error"] for d in s["families"].values())
    assert s["partial"] and "not played: rollout.max_model_len: 40 tokens" in suite_table.markdown(s)
