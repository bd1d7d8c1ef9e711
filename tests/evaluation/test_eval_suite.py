"""`python -m jobs.eval_suite`: one target on the paper's evaluation families, one table.

The scripted experts play two indices of each family in this process (AgentBench's families on a fixture checkout
in AgentBench's layout; db on sqlite here, MariaDB being the suite's own default, run by hand: docs/report.md
section 5), every family at once: suite.json and suite.md, the Wilson intervals, the paper's rows, the same
episodes as `--sequential` plays, a rerun that reuses every family and `--fresh` that replays them, a budget spent
before the first family. Through the library, with envs slow enough to be cut or players that count what is in
flight: a budget that runs out inside families counts the episodes left as unfinished, and the same command
(at once or sequentially) scores exactly them; never more than the suite's concurrency in flight, nor more than a
family's own (its modes together); `sequential` plays one family and mode after another.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agentrl.evaluation import suite, suite_plan, suite_table
from agentrl.evaluation.evaluate import Settings
from agentrl.evaluation.players import ExpertPlayer
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


def _outcomes(out: Path, family: str, stem: str) -> dict[Any, tuple[Any, ...]]:
    return {e.key: (e.success, e.status, e.turns) for e in read_results(out / family / f"{stem}.jsonl")}


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
    # every family and mode at once, each one's progress lines named with its mode
    assert "db greedy, db sampled, os greedy" in p.stdout or "db greedy, db sampled, kg greedy" in p.stdout
    assert "eval kg greedy: 2/2" in p.stdout and "eval kg sampled: 4/4" in p.stdout
    assert not s["sequential"] and any(d["greedy"]["shared"] for d in fams.values())
    assert "(shared)" in (out / "suite.md").read_text()

    seq = _suite(tmp_path / "sequential", checkouts, "--sequential")  # the same episodes, one family at a time
    assert seq.returncode == 0, seq.stderr[-3000:]
    assert "at once" not in seq.stdout and "eval kg: 2/2" in seq.stdout
    s_seq = json.loads((tmp_path / "sequential" / "suite.json").read_text())
    assert s_seq["sequential"] and list(s_seq["families"]) == list(fams)
    for name, d in s_seq["families"].items():
        stem = Path(d["greedy"]["results"]).stem
        assert _outcomes(tmp_path / "sequential", name, stem) == _outcomes(out, name, stem), name
        assert {k: d["greedy"][k] for k in ("episodes", "successes", "status")} == \
            {k: fams[name]["greedy"][k] for k in ("episodes", "successes", "status")}
        assert not d["greedy"]["shared"]
    assert "(shared)" not in (tmp_path / "sequential" / "suite.md").read_text()
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
    """lookup (and unlock) in this process, each env step taking `delay_s`: a budget of a second cuts a family in
    the middle."""

    def __init__(self, delay_s: float, tasks: tuple[str, ...] = ("lookup",)) -> None:
        super().__init__({t: get_task(t) for t in tasks})
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


TWO = (suite_plan.Family("lookup", "test"), suite_plan.Family("unlock", "test"))


def _play(client: Any, spec: suite_plan.SuiteSpec, out: Path, max_new_tokens: int = 32
          ) -> tuple[dict[str, Any], dict[str, Any]]:
    """One command of the scripted experts' suite through the library: what it did and its summary."""
    target = resolve("expert")
    settings = Settings(0.0, 1.0, EpisodeLimits(0, 1024, max_new_tokens), Retry(max_retries=0))

    async def go() -> tuple[list[suite_plan.FamilyPlan], dict[str, Any]]:
        plans = await suite_plan.plan(client, spec, settings.limits)
        return plans, await suite.run_suite(client, target, spec, settings, out, plans, False, lambda _: None)

    plans, done = asyncio.run(go())
    return done, suite_table.summarize(target, spec, plans, out, label="x", scale="", command="", wall_s=1.0,
                                       engine_s=0.0, stopped=done["stopped"])


def test_a_budget_cuts_every_family_at_once_and_the_same_command_goes_on(tmp_path: Path) -> None:
    """Both families play at once, so a budget cuts both (each named in `stopped`); each rerun of the same command
    scores only what is left, until none is."""
    client = SlowClient(0.1, ("lookup", "unlock"))
    spec = suite_plan.SuiteSpec(TWO, samples=12, budget_s=1.0, concurrency=2)  # >= 1.2 s for either alone
    done, s = _play(client, spec, tmp_path)
    assert done["stopped"] == "lookup greedy, unlock greedy"
    assert s["partial"] and "budget ran out at lookup greedy, unlock greedy" in s["partial_reason"]
    for d in s["families"].values():
        r = d["greedy"]
        assert 0 < r["episodes"] < 12 and r["status"]["unfinished"] == r["unfinished"] == 12 - r["episodes"]
        assert r["shared"]
    for _ in range(12):
        if not done["stopped"]:
            break
        before = {n: d["greedy"]["episodes"] for n, d in s["families"].items()}
        done, s = _play(client, spec, tmp_path)
        assert sum(d["greedy"]["episodes"] for d in s["families"].values()) > sum(before.values())
    assert not done["stopped"] and s["partial_reason"] == "the first 12 indices of each split only"
    for name in ("lookup", "unlock"):
        r = s["families"][name]["greedy"]
        assert (r["episodes"], r["unfinished"], r["successes"]) == (12, 0, 12)
        sessions = _sessions(tmp_path, name, "eval-test-greedy")
        assert sum(x["scored"] for x in sessions) == 12 and len(read_results(r["results"])) == 12
        assert [x["stopped"] for x in sessions] == ["budget"] * (len(sessions) - 1) + [""]
        assert r["wall_s"] == pytest.approx(sum(x["wall_s"] for x in sessions), abs=0.1)
    md = suite_table.markdown(s)
    assert "(shared)" in md and "overlap" in md


def test_a_suite_resumes_across_sequential_and_at_once(tmp_path: Path) -> None:
    """Neither the concurrency nor the order is in the fingerprint: a suite cut sequentially goes on at once and
    back, on the same files, to the same episodes."""
    client = SlowClient(0.1, ("lookup", "unlock"))
    seq = suite_plan.SuiteSpec(TWO, samples=12, budget_s=1.0, concurrency=2, sequential=True)  # >= 1.2 s each
    done, s = _play(client, seq, tmp_path)
    assert done["stopped"] == "lookup greedy"  # sequential: lookup cut, unlock not started
    assert s["families"]["unlock"]["greedy"]["episodes"] == 0 < s["families"]["lookup"]["greedy"]["episodes"]
    meta = (tmp_path / "lookup" / "eval-test-greedy.meta.json").read_text()
    done, s = _play(client, replace(seq, sequential=False, budget_s=0.8), tmp_path)
    assert "unlock greedy" in done["stopped"]
    with pytest.raises(ValueError, match="scored with other settings"):  # itself, not a group, from at once
        _play(client, replace(seq, sequential=False), tmp_path, max_new_tokens=64)
    done, s = _play(client, replace(seq, budget_s=0.0), tmp_path)
    assert not done["stopped"]
    for name in ("lookup", "unlock"):
        assert s["families"][name]["greedy"]["episodes"] == s["families"][name]["greedy"]["successes"] == 12
    assert (tmp_path / "lookup" / "eval-test-greedy.meta.json").read_text() == meta


def test_a_signal_while_families_play_at_once_records_each_session(tmp_path: Path) -> None:
    """jobs.eval_suite's SIGTERM/SIGINT handler raises SystemExit in the event loop: every session playing then
    records its wall time as stopped, the table says so, and the same command goes on."""
    client = SlowClient(0.1, ("lookup", "unlock"))
    spec = suite_plan.SuiteSpec(TWO, samples=12, concurrency=2)
    target = resolve("expert")
    settings = Settings(0.0, 1.0, EpisodeLimits(0, 1024, 32), Retry(max_retries=0))
    plans: list[suite_plan.FamilyPlan] = []

    def signal() -> None:
        raise SystemExit(143)

    async def go() -> None:
        plans.extend(await suite_plan.plan(client, spec, settings.limits))
        asyncio.get_running_loop().call_later(0.6, signal)
        await suite.run_suite(client, target, spec, settings, tmp_path, plans, False, lambda _: None)

    with pytest.raises(SystemExit):
        asyncio.run(go())
    s = suite_table.summarize(target, spec, plans, tmp_path, label="x", scale="", command="", wall_s=1.0,
                              engine_s=0.0, interrupted=True)
    assert s["partial"] and "stopped by a signal" in s["partial_reason"]
    for name in ("lookup", "unlock"):
        (session,) = _sessions(tmp_path, name, "eval-test-greedy")
        assert session["stopped"] == "error or signal" and session["alongside"]
        assert session["scored"] == s["families"][name]["greedy"]["episodes"] < 12
    done, s = _play(client, spec, tmp_path)
    assert not done["stopped"] and all(d["greedy"]["successes"] == 12 for d in s["families"].values())


class Counted:
    """What the counting players have in flight: in all, per family, per player (one per family and mode)."""

    def __init__(self) -> None:
        self.now: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.starts: list[tuple[str, int]] = []  # (task, player) of each episode, as it starts
        self.players = 0
        self.overlaps = 0  # episodes started while another family's were in flight

    def player(self) -> type:
        counted = self

        class CountingPlayer(ExpertPlayer):
            def __init__(self, *args: Any) -> None:
                super().__init__(*args)
                self.n, counted.players = counted.players, counted.players + 1

            async def play(self, task: str, index: str, group: str) -> Any:
                me = f"player {self.n}"
                counted.overlaps += any(counted.now[t] for t in ("lookup", "unlock") if t != task)
                counted.starts.append((task, self.n))
                for k in ("all", task, me):
                    counted.now[k] += 1
                    counted.peak[k] = max(counted.peak[k], counted.now[k])
                try:
                    await asyncio.sleep(0.01)
                    return await super().play(task, index, group)
                finally:
                    for k in ("all", task, me):
                        counted.now[k] -= 1

        return CountingPlayer


def test_at_once_the_suite_and_each_family_keep_their_caps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never more than `concurrency` episodes in flight, nor more than lookup's 2 (its greedy and sampled runs
    together), both caps reached, the families interleaved and every episode scored."""
    counted = Counted()
    monkeypatch.setattr(suite, "ExpertPlayer", counted.player())
    client = InProcessClient({"lookup": get_task("lookup"), "unlock": get_task("unlock")})
    families = (replace(TWO[0], concurrency=2), TWO[1])
    spec = suite_plan.SuiteSpec(families, samples=8, sampled_runs=2, concurrency=3)
    done, s = _play(client, spec, tmp_path)
    assert not done["stopped"] and counted.now["all"] == 0
    assert counted.peak["all"] == 3 and counted.peak["lookup"] == 2
    assert counted.overlaps > 0 and counted.players == 4 == len({p for _, p in counted.starts})
    for d in s["families"].values():
        assert (d["greedy"]["episodes"], d["sampled"]["episodes"]) == (8, 16)
    assert s["families"]["lookup"]["concurrency"] == 2 and s["concurrency"] == 3


def test_a_freed_slot_goes_to_the_family_with_fewest_in_flight() -> None:
    """db waiting behind another family's queue gets the next slot (not the next in line), never more than its
    cap; a waiter cancelled before its turn takes none with it."""
    async def go() -> None:
        slots = suite.Slots(3, {"db": 2})
        got: list[str] = []

        async def take(family: str) -> None:
            await slots.acquire(family)
            got.append(family)

        for _ in range(3):
            await take("kg")
        waiting = [asyncio.create_task(take(f)) for f in ("kg", "kg", "db", "db", "db")]
        await asyncio.sleep(0)
        waiting[0].cancel()  # the first kg in line gives up
        await asyncio.sleep(0)
        for _ in range(4):
            slots.release("kg")
            await asyncio.sleep(0)
        assert got[3:] == ["db", "kg", "db"]  # db first, though behind a kg; then the fewest in flight
        assert (slots.busy["db"], slots.busy["kg"], slots.free) == (2, 0, 1)  # db at its cap: a slot stays free
        slots.release("db")
        await asyncio.sleep(0)
        assert got[6:] == ["db"] and (slots.busy["db"], slots.free) == (2, 1)
        assert all(t.done() for t in waiting) and waiting[0].cancelled()

    asyncio.run(go())


def test_sequential_plays_one_family_and_mode_after_another(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counted = Counted()
    monkeypatch.setattr(suite, "ExpertPlayer", counted.player())
    client = InProcessClient({"lookup": get_task("lookup"), "unlock": get_task("unlock")})
    families = (replace(TWO[0], concurrency=2), TWO[1])
    spec = suite_plan.SuiteSpec(families, samples=8, sampled_runs=2, concurrency=3, sequential=True)
    done, s = _play(client, spec, tmp_path)
    assert not done["stopped"] and counted.overlaps == 0
    players = [p for _, p in counted.starts]
    assert counted.players == 4 and players == sorted(players)  # each one's episodes all before the next one's
    assert [t for t, _ in counted.starts] == ["lookup"] * 24 + ["unlock"] * 24  # greedy then sampled, per family
    assert counted.peak["lookup"] == 2 and counted.peak["unlock"] == 3
    assert not any(d[m]["shared"] for d in s["families"].values() for m in ("greedy", "sampled"))


@pytest.mark.parametrize("sequential", [False, True], ids=["at-once", "sequential"])
def test_a_local_model_plays_every_family_and_mode_on_one_engine(lookup_format, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  sequential: bool) -> None:
    """A local target: one engine for the suite (however many sessions ask for it at once), opened with its longest
    context and concurrency, each family and mode played in the model's format under its own limits; a context
    that cannot hold a family's first prompts leaves that family unplayed, with the reason (said once), and the
    others played."""
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
        spec = suite_plan.SuiteSpec(families, samples=3, sampled_runs=2, concurrency=3, sequential=sequential)

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
    if sequential:  # after the first family, each one's worst case is also put in minutes at the rate so far
        assert "tokens/s" not in said[0] and all("tokens/s this command measured so far" in x for x in said[1:])
    else:  # all at once: what the others have left, as each one ends
        assert said[0].startswith("playing lookup greedy, lookup sampled, unlock greedy, unlock sampled at once")
        assert any("still playing" in x and "tokens/s this command measured so far" in x for x in said)

    opened.clear()
    said.clear()
    s = play(40, tmp_path / "too-short")  # no first prompt fits 40 tokens
    assert opened == [] and all("cannot hold the first prompt" in d["error"] for d in s["families"].values())
    assert sum("cannot be played" in x for x in said) == 2
    assert s["partial"] and "not played: rollout.max_model_len: 40 tokens" in suite_table.markdown(s)
