"""Cross-policy sampling's router (`EnginePool`) with fake engines: which engine gets each turn, the refresh
of the lagging pool every K versions, and that every action token records the engine and version that
produced it, also when the lagging engine is refreshed in the middle of an episode."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from agentrl.rollout.engine import Generation, SamplingConfig
from agentrl.rollout.engine_pool import EnginePool
from agentrl.types import (
    LAGGING_ENGINE_BASE,
    TrajectoryBuilder,
    current_engine_id,
    is_lagging_engine,
    lagging_engine_id,
)

SAMPLING = SamplingConfig(max_new_tokens=4, temperature=1.0)


class FakeEngine:
    """Answers each turn with tokens that spell its id and version, so a token shows who produced it."""

    def __init__(self, engine_id: int, version: int = -1) -> None:
        self.engine_id, self.version = engine_id, version
        self.calls = 0
        self.loads: list[int] = []
        self.closed = False

    async def generate(self, prompt_ids: list[int], sampling: SamplingConfig, **context: Any) -> Generation:
        self.calls += 1
        await asyncio.sleep(0)
        ids = [self.engine_id * 100 + self.version] * 3
        return Generation(ids, [-float(self.engine_id + 1)] * 3, "stop", self.version, self.engine_id)

    async def load_weights(self, weights: Callable[[], Any], version: int) -> None:
        assert dict(weights())["w"] == version  # the loader is the one for this version
        self.loads.append(version)
        self.version = version

    def close(self) -> None:
        self.closed = True


def loader(version: int) -> Callable[[], Any]:
    return lambda: iter([("w", version)])


def pool(prob: float, refresh: int = 2, seed: int = 0) -> tuple[EnginePool, FakeEngine, FakeEngine]:
    cur, lag = FakeEngine(0), FakeEngine(lagging_engine_id(0, 0, 1))
    p = EnginePool(cur, [lag], prob, refresh, seed=seed)
    asyncio.run(p.load_weights(loader(0), 0))
    return p, cur, lag


async def turns(p: EnginePool, n: int) -> list[Generation]:
    return [await p.generate([1, 2], SAMPLING) for _ in range(n)]


def test_engine_ids_tell_the_pools_apart() -> None:
    assert [lagging_engine_id(r, k, 2) for r in (0, 1) for k in (0, 1)] == [1000, 1001, 1002, 1003]
    assert not is_lagging_engine(999) and is_lagging_engine(LAGGING_ENGINE_BASE)
    assert is_lagging_engine(np.array([-2, -1, 0, 7, 1000, 1005], np.int16)).tolist() == [0, 0, 0, 0, 1, 1]
    with pytest.raises(ValueError, match="int16"):
        lagging_engine_id(20000, 0, 2)
    # current engines: rank r's j-th is r * per_rank + j, unique across ranks; with one per rank, the rank
    assert [current_engine_id(r, j, 3) for r in (0, 1) for j in range(3)] == [0, 1, 2, 3, 4, 5]
    assert [current_engine_id(r, 0, 1) for r in range(4)] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="lagging ids"):
        current_engine_id(500, 1, 2)
    with pytest.raises(ValueError):
        current_engine_id(0, 3, 3)


async def episode_turns(p: EnginePool, episode: str, n: int) -> list[int]:
    return [(await p.generate([1], SAMPLING, session_id=episode)).engine_id for _ in range(n)]


def test_episodes_spread_over_the_current_engines_and_keep_theirs() -> None:
    """Two current engines (ids 2, 3: rank 1's), no lagging pool: one episode at a time alternates the engines
    (ties: fewest episodes so far), and every turn of an episode stays on the engine its first turn got."""
    a, b = FakeEngine(2, 0), FakeEngine(3, 0)
    p = EnginePool([a, b])
    async def run() -> list[list[int]]:
        return [await episode_turns(p, f"s{i}", 3) for i in range(4)] + [await episode_turns(p, "s0", 2)]
    per_episode = asyncio.run(run())
    assert per_episode == [[2, 2, 2], [3, 3, 3], [2, 2, 2], [3, 3, 3], [2, 2]]
    assert (a.calls, b.calls, p.episodes) == (8, 6, [2, 2])
    assert p.policy is p and p.in_flight == [0, 0]


def test_a_new_episode_goes_to_the_current_engine_with_fewer_turns_in_flight() -> None:
    a, b = FakeEngine(0, 0), FakeEngine(1, 0)
    p = EnginePool([a, b])
    gate = asyncio.Event()
    slow = a.generate

    async def held(prompt_ids: list[int], sampling: SamplingConfig, **context: Any) -> Generation:
        await gate.wait()
        return await slow(prompt_ids, sampling, **context)
    a.generate = held  # type: ignore[method-assign]

    async def run() -> list[int]:
        first = [asyncio.create_task(p.generate([1], SAMPLING, session_id=f"busy{i}")) for i in range(3)]
        await asyncio.sleep(0)  # busy0 -> engine 0 (both idle), busy1 -> 1, busy2 -> 0 (1 turn each in flight)
        assert p.in_flight[0] == 2 and p.episodes == [2, 1]
        later = [(await p.generate([1], SAMPLING, session_id=f"new{i}")).engine_id for i in range(2)]
        gate.set()
        await asyncio.gather(*first)
        return later
    assert asyncio.run(run()) == [1, 1]  # engine 0 is still held on two turns: the new episodes go to 1


def test_every_current_engine_takes_every_version_and_lagging_turns_stay_lagging() -> None:
    a, b, lag = FakeEngine(0), FakeEngine(1), FakeEngine(lagging_engine_id(0, 0, 1))
    p = EnginePool([a, b], [lag], lagging_prob=0.5, refresh_steps=3, seed=1)
    for v in range(4):
        asyncio.run(p.load_weights(loader(v), v))
    assert a.loads == b.loads == [0, 1, 2, 3] and lag.loads == [0, 3] and p.version == 3
    assert p.policy.currents == [a, b] and not p.policy.lagging  # evaluation: the current engines alone
    gens = asyncio.run(episode_turns(p, "s", 200))
    assert set(gens) == {0, 1000} or set(gens) == {1, 1000}  # one current engine for the episode, + lagging
    p.close()
    assert a.closed and b.closed and lag.closed


def test_prob_zero_never_calls_the_lagging_engine() -> None:
    p, cur, lag = pool(0.0)
    gens = asyncio.run(turns(p, 200))
    assert lag.calls == 0 and cur.calls == 200
    assert {g.engine_id for g in gens} == {0}
    assert p.take_metrics()["rollout/lagging_turn_frac"] == 0.0


def test_prob_one_always_calls_the_lagging_engine() -> None:
    p, cur, lag = pool(1.0)
    gens = asyncio.run(turns(p, 50))
    assert cur.calls == 0 and lag.calls == 50
    assert {g.engine_id for g in gens} == {1000}


def test_prob_half_splits_turns_and_is_seeded() -> None:
    routes = []
    for seed in (3, 3, 4):
        p, _, _ = pool(0.5, seed=seed)
        routes.append([g.engine_id for g in asyncio.run(turns(p, 400))])
    assert routes[0] == routes[1] and routes[0] != routes[2]
    frac = sum(e == 1000 for e in routes[0]) / 400
    assert 0.42 < frac < 0.58, frac


def test_pool_without_lagging_engines_is_the_current_engine() -> None:
    cur = FakeEngine(5)
    p = EnginePool(cur)
    asyncio.run(p.load_weights(loader(2), 2))
    assert (p.engine_id, p.version) == (5, 2) and p.take_metrics() == {}
    with pytest.raises(ValueError, match="lagging engine"):
        EnginePool(cur, [], lagging_prob=0.1)


def test_lagging_engine_refreshes_every_k_versions() -> None:
    p, cur, lag = pool(0.5, refresh=3)
    assert lag.loads == [0]  # at the start it holds the first weights
    for v in range(1, 8):
        asyncio.run(p.load_weights(loader(v), v))
        assert 0 <= cur.version - lag.version < 3
    assert cur.loads == list(range(8)) and lag.loads == [0, 3, 6]
    # versions that jump (the rollout takes the newest): refresh as soon as the gap reaches K
    asyncio.run(p.load_weights(loader(20), 20))
    assert lag.loads[-1] == 20 and p.lagging_versions == [20]


def test_tokens_record_the_engine_and_version_that_produced_them_across_a_refresh() -> None:
    """One episode's turns, built as the agent loop builds them, with the lagging engine refreshed (and the
    current one swapped) between turns: each turn's tokens carry exactly their producer's id and version."""
    p, cur, lag = pool(0.5, refresh=2, seed=1)

    async def episode() -> tuple[TrajectoryBuilder, list[tuple[int, int]]]:
        b, producers = TrajectoryBuilder(), []
        b.add_context([1, 2, 3])
        for turn in range(40):
            if turn in (10, 20, 30):  # a new trainer version arrives while the episode runs
                v = cur.version + 1
                await p.load_weights(loader(v), v)
            gen = await p.generate(b.tokens, SAMPLING)
            b.add_action(gen.token_ids, gen.logprobs, gen.version, gen.engine_id)
            producers.append((gen.engine_id, gen.version))
            b.add_context([9])
        return b, producers

    b, producers = asyncio.run(episode())
    t = b.build(traj_id="t", task="x", index="0", group_id="g", reward=0.0, status="completed", num_turns=40)
    act = t.loss_mask == 1
    # the token values encode engine id and version at generation time: they must agree with the record
    assert (t.tokens[act] == t.engine[act].astype(np.int32) * 100 + t.policy_version[act]).all()
    assert (t.logprobs[act] == -(t.engine[act].astype(np.float32) + 1)).all()
    lagging = {v for e, v in producers if e == 1000}
    current = {v for e, v in producers if e == 0}
    assert lagging == {0, 2} and current == {0, 1, 2, 3}  # refreshed at v2 (K=2), not at v1 or v3
    assert lag.loads == [0, 2] and cur.loads == [0, 1, 2, 3]
    assert t.oldest_version(lagging=True) == 0 and t.oldest_version(lagging=False) == 0
    assert set(t.engine[t.loss_mask == 0].tolist()) == {-1}
    m = p.take_metrics()
    assert 0.3 < m["rollout/lagging_turn_frac"] < 0.7 and m["rollout/lagging_version"] == 2.0
    assert m["rollout/lagging_version_lag_max"] == 1.0  # v1 (current) vs v0 (lagging), or v3 vs v2


def test_concurrent_turns_keep_their_producer_when_the_pool_swaps_mid_flight() -> None:
    """A swap that lands while turns are in flight cannot relabel them: the label comes with the Generation."""
    p, cur, lag = pool(0.5, refresh=1, seed=2)

    async def go() -> list[Generation]:
        tasks = [asyncio.create_task(p.generate([1], SAMPLING)) for _ in range(50)]
        await p.load_weights(loader(1), 1)  # both engines move to v1 while those turns run
        tasks += [asyncio.create_task(p.generate([1], SAMPLING)) for _ in range(50)]
        return list(await asyncio.gather(*tasks))

    for g in asyncio.run(go()):
        assert g.token_ids[0] == g.engine_id * 100 + g.version


def test_close_closes_every_engine() -> None:
    p, cur, lag = pool(0.5)
    p.close()
    assert cur.closed and lag.closed
