"""In-flight weight updates in the rollout rank (`rollout.role.RolloutLoop`), deterministically:
episodes of the real `lookup` task (in process, each env call made slow) are mid-trajectory when the
trainer's notice of v1 arrives; the engine takes v1 between generation calls, so those episodes finish on
v1 and their trajectories carry both versions, each turn wholly one version, v0 turns before v1 turns.
The `abort` policy restarts them instead: no trajectory carries two versions. (The MPI and vLLM sides are
tested in tests/e2e/test_async_run.py; here the channel and the engine are small stand-ins.)"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from agentrl.config import RolloutConfig, RunConfig
from agentrl.rollout import role
from agentrl.rollout.engine import Generation, SamplingConfig
from agentrl.rollout.env_latency import SlowClient
from agentrl.rollout.spec import RolloutSpec
from agentrl.serving.inprocess import InProcessClient
from agentrl.tasks import get_task


def _spec(concurrency: int) -> RolloutSpec:
    """One task (lookup), groups of 2 episodes, 2 groups per step, 16 new tokens a turn."""
    rollout = RolloutConfig(groups_per_task=2, group_size=2, eval_samples=0, concurrency=concurrency,
                            max_new_tokens=16)
    return RolloutSpec.from_config(RunConfig(rollout=rollout))


class Engine:
    """Answers every turn with the same malformed call (the task answers with an error, the episode goes on
    to its turn limit), tagged with the version it holds when the turn is generated."""

    engine_id = 0

    def __init__(self, tok) -> None:
        self.tok, self.version, self.loads = tok, -1, []

    async def generate(self, prompt_ids: list[int], sampling: SamplingConfig, **context) -> Generation:
        version = self.version  # as vLLM's engine: a request keeps the weights it was added under
        await asyncio.sleep(0.01)
        ids = self.tok.encode("not a tool call")
        return Generation(ids, [-1.0] * len(ids), "length", version, self.engine_id)

    async def load_weights(self, loader, version: int) -> None:
        self.loads.append(version)
        self.version = version

    def close(self) -> None:
        pass


class Channel:
    """The trainer's side, scripted: v1 is announced once the first episode has played one turn; the
    trainer stops the rank once `stop_after` trajectories arrived."""

    def __init__(self, engine: Engine, stop_after: int) -> None:
        self.engine, self.stop_after = engine, stop_after
        self.version, self.stopped, self.received = 0, False, []

    def poll_notices(self) -> None:
        if self.version == 0 and self.engine.turns_started >= 1:
            self.version = 1
        if len(self.received) >= self.stop_after:
            self.stopped = True

    def send(self, batch) -> float:
        self.received += batch
        return 0.0


class Weights:
    def newest(self, notice_version: int):
        return notice_version, (lambda: iter(()))


class Monitor:
    def scalars(self, metrics, step) -> None:
        pass


def _run(tmp_path: Path, tok, inflight: str) -> tuple[list, Engine]:
    engine = Engine(tok)
    counting = engine.generate
    engine.turns_started = 0

    async def generate(*a, **k):
        engine.turns_started += 1
        return await counting(*a, **k)

    engine.generate = generate
    client = SlowClient(InProcessClient({"lookup": get_task("lookup")}), 0.05, 0.0, seed=0)
    spec = _spec(concurrency=8)
    place = role.RankPlace(rank=0, ranks=1, max_staleness=1, inflight=inflight)
    ch = Channel(engine, stop_after=8)

    async def main() -> None:
        await engine.load_weights(None, 0)
        pipe = role.RolloutLoop(tmp_path, client, tok, engine, spec, place, ch, Weights(), Monitor())
        idx = await client.indices("lookup", "train")
        await asyncio.wait_for(pipe.run({"lookup": idx}, 0.005), 60)

    asyncio.run(main())
    return ch.received, engine


def _turn_versions(t) -> list[int]:
    act = t.loss_mask == 1
    edges = np.flatnonzero(np.diff(act.astype(np.int8)) != 0) + 1
    out = []
    for seg_v, seg_a in zip(np.split(t.policy_version, edges), np.split(act, edges)):
        if seg_a.all():
            assert len(set(seg_v.tolist())) == 1  # a turn is one generation: one version
            out.append(int(seg_v[0]))
    return out


@pytest.mark.parametrize("inflight", ["swap", "abort"])
def test_episodes_mid_trajectory_take_the_new_weights(tmp_path: Path, lookup_format, inflight: str) -> None:
    received, engine = _run(tmp_path, lookup_format, inflight)
    assert engine.loads == [0, 1]
    assert len(received) >= 8
    spans = 0
    for t in received:
        turns = _turn_versions(t)
        assert turns == sorted(turns) and set(turns) <= {0, 1} and len(turns) == t.num_turns == 4
        spans += len(set(turns)) == 2
    if inflight == "swap":
        assert spans >= 4  # the first group's episodes were all mid-trajectory at the swap
    else:
        assert spans == 0  # aborted and started again on v1 instead
        assert all(_turn_versions(t) == [1, 1, 1, 1] for t in received)


class StuckChannel(Channel):
    """A trainer that never publishes: the rank fills its staleness window and then waits at its bound;
    the run stops `hold_s` after the window's trajectories all arrived."""

    def __init__(self, engine: Engine, window: int, hold_s: float) -> None:
        super().__init__(engine, stop_after=window)
        self.hold_s, self.full_at = hold_s, None

    def poll_notices(self) -> None:
        if len(self.received) >= self.stop_after and self.full_at is None:
            self.full_at = time.perf_counter()
        if self.full_at is not None and time.perf_counter() - self.full_at >= self.hold_s:
            self.stopped = True


@pytest.mark.parametrize("concurrency", [8, 2])
def test_the_report_says_when_the_staleness_window_binds(tmp_path: Path, lookup_format, concurrency: int) -> None:
    """(max_staleness + 1) x groups per step = 2 x 2 groups of 2 = 8 episodes may start on v0. With room for 8
    at once the window is what stops admission (all of the waiting time after the 8 finish); with room for 2,
    concurrency binds while the window still has groups to start, and the window only after its last group."""
    engine = Engine(lookup_format)
    engine.turns_started = 0
    client = SlowClient(InProcessClient({"lookup": get_task("lookup")}), 0.02, 0.0, seed=0)
    spec = _spec(concurrency)
    ch = StuckChannel(engine, window=8, hold_s=1.0)

    async def main() -> role.RolloutLoop:
        await engine.load_weights(None, 0)
        pipe = role.RolloutLoop(tmp_path, client, lookup_format, engine, spec,
                                role.RankPlace(rank=0, ranks=1, max_staleness=1), ch, Weights(), Monitor())
        await asyncio.wait_for(pipe.run({"lookup": await client.indices("lookup", "train")}, 0.005), 60)
        return pipe

    stats = asyncio.run(main()).stats
    assert len(ch.received) == 8  # the window, exactly: no group past the bound started
    wall = stats["wall_s"]
    # after the 8 arrived, the rank held at the bound for hold_s with nothing running
    assert stats["window_bound_s"] >= 0.9 and stats["idle_s"] >= 0.9
    assert 0.0 < stats["window_bound_frac"] <= 1.0 and stats["window_bound_frac"] == pytest.approx(
        stats["window_bound_s"] / wall)
    assert 0.0 < stats["in_flight_mean"] <= concurrency
    if concurrency == 2:  # the first 3 groups waited for room, not for the window: it binds only at the end
        assert stats["window_bound_s"] < stats["idle_s"] + 0.2 and stats["in_flight_mean"] <= 2
