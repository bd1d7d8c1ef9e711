"""Cross-policy sampling (AgentRL §3.3, docs/architecture.md §5): a rollout rank's current engines and lagging pool.

`EnginePool` looks like one engine to the agent loop. Each `generate` call (one assistant turn) goes to a
lagging engine with probability `lagging_prob`, drawn from a seeded RNG, and otherwise to a current engine: the one
its episode was given at its first current turn (the least busy then, so episodes spread over the rank's
current engines and an episode's turns reuse one engine's prefix cache). Every current engine takes every
new version it is given; a lagging engine keeps its weights until the current version is `refresh_steps`
(K) or more ahead of it, then loads the newest ones, so it samples at most K − 1 versions behind. Mixing
turns of an older policy into an episode diversifies the trajectories (the paper's motivation); the trainer's
off-policy loss divides by the behaviour log-prob each token recorded, so the ratio stays correct for lagging
tokens.

Which engine and version produced a turn is recorded by that engine in its `Generation` (`engine_id`,
`version`), never read off the pool at turn time: a swap that lands while a turn is in flight cannot
mislabel it. Engine ids follow `agentrl.types` (current < LAGGING_ENGINE_BASE <= lagging), so the trainer
tells the pools apart from the shards alone.

Not here: evaluation (it uses `pool.policy`, the current engines alone: the policy being trained) and weight
sources (the caller passes loaders, zero-argument callables yielding (name, tensor), as to any engine's
`load_weights`).
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import random
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.rollout.engine import Engine, Generation, SamplingConfig


class EnginePool:
    """The current engines plus `lagging` engines; routes each turn, refreshes the lagging ones every K versions.

    Args:
        current: the engine, or engines, that always hold the newest weights; the first gives the pool's
            `engine_id`.
        lagging: the lagging pool (may be empty: the pool is then the current engines alone).
        lagging_prob: probability that a turn goes to the lagging pool (one engine of it, chosen uniformly).
        refresh_steps: K; a lagging engine reloads when the newest version is K or more ahead of its own.
        seed: seeds the routing RNG.
    """

    # Episodes remembered for their current engine; an older one that comes back is placed again (its next
    # turn misses that engine's prefix cache, nothing else). Far more than a rank runs at once.
    MAX_EPISODES = 1 << 16

    def __init__(self, current: Engine | Sequence[Engine], lagging: Sequence[Engine] = (), lagging_prob: float = 0.0,
                 refresh_steps: int = 1, seed: int | str = 0) -> None:
        currents = list(current) if isinstance(current, Sequence) else [current]
        if not currents:
            raise ValueError("a pool needs at least one current engine")
        if not 0.0 <= lagging_prob <= 1.0:
            raise ValueError(f"lagging prob must be in [0, 1], got {lagging_prob}")
        if lagging_prob > 0 and not lagging:
            raise ValueError("a lagging prob > 0 needs at least one lagging engine")
        if refresh_steps < 1:
            raise ValueError(f"refresh_steps must be >= 1, got {refresh_steps}")
        self.currents, self.lagging = currents, list(lagging)
        self.current = currents[0]
        self.lagging_prob, self.refresh_steps = lagging_prob, refresh_steps
        self._rng = random.Random(seed)
        # Versions the lagging engines were last told to load (None: no weights loaded through the pool yet;
        # their first load is always taken, so at the start they hold the first weights).
        self.lagging_versions: list[int | None] = [None] * len(self.lagging)
        self.totals = _Counts()
        self.window = _Counts()
        self.in_flight = [0] * len(currents)  # turns each current engine is generating now
        self.episodes = [0] * len(currents)  # episodes placed on each current engine
        self._placed: collections.OrderedDict[Any, int] = collections.OrderedDict()
        self._turn = itertools.count()  # turns without an episode id: one after the other
        # Evaluation's engine: the current engines alone, routed the same way (no lagging turn).
        self.policy: Any = currents[0] if len(currents) == 1 else self if not self.lagging else EnginePool(currents)

    @property
    def engine_id(self) -> int:
        return self.current.engine_id

    @property
    def version(self) -> int:
        """The version every current engine holds (they differ only while a swap is under way)."""
        return min(e.version for e in self.currents)

    def route(self, episode: Any = None) -> Engine:
        """The engine for the next turn of `episode` (one RNG draw per turn while the pool has lagging engines)."""
        if self.lagging and self._rng.random() < self.lagging_prob:
            return self._rng.choice(self.lagging)
        return self.currents[self.place(episode)]

    def place(self, episode: Any = None) -> int:
        """The current engine (its index) of `episode`'s turns: on its first turn, the engine with the fewest
        turns in flight, then the fewest episodes so far, then the first. None: no episode to keep together."""
        if len(self.currents) == 1:
            return 0
        if episode is None:
            return next(self._turn) % len(self.currents)
        k = self._placed.get(episode)
        if k is None:
            k = min(range(len(self.currents)), key=lambda i: (self.in_flight[i], self.episodes[i], i))
            self.episodes[k] += 1
            if len(self._placed) >= self.MAX_EPISODES:
                self._placed.popitem(last=False)
        self._placed[episode] = k
        self._placed.move_to_end(episode)
        return k

    async def generate(self, prompt_ids: list[int], sampling: SamplingConfig, **context: Any) -> Generation:
        engine = self.route(context.get("session_id"))
        lagging = engine not in self.currents
        k = -1 if lagging else self.currents.index(engine)
        if k >= 0:
            self.in_flight[k] += 1
        try:
            gen = await engine.generate(prompt_ids, sampling, **context)
        finally:
            if k >= 0:
                self.in_flight[k] -= 1
        lag = self.version - gen.version if lagging else 0
        for c in (self.totals, self.window):
            c.add(lagging, len(gen.token_ids), lag)
        return gen

    async def load_weights(self, weights: Callable[[], Any], version: int) -> None:
        """Give `version` to every current engine, and to each lagging engine K or more versions behind it.

        The loads are queued together, so a lagging turn asked for after this call starts waits for its
        engine's refresh (an engine applies swaps before later requests)."""
        loads = [e.load_weights(weights, version) for e in self.currents]
        for i, (engine, held) in enumerate(zip(self.lagging, self.lagging_versions)):
            if held is None or version - held >= self.refresh_steps:
                self.lagging_versions[i] = version
                loads.append(engine.load_weights(weights, version))
        await asyncio.gather(*loads)

    def take_metrics(self) -> dict[str, float]:
        """Routing metrics since the last call (an empty dict without a lagging pool)."""
        if not self.lagging:
            return {}
        out = self.window.metrics()
        held = [v for v in self.lagging_versions if v is not None]
        out["rollout/lagging_version"] = float(min(held, default=-1))
        self.window = _Counts()
        return out

    def close(self) -> None:
        for engine in [*self.currents, *self.lagging]:
            engine.close()


class _Counts:
    """Turns and action tokens by pool, and the lagging turns' lag behind the current engine."""

    def __init__(self) -> None:
        self.turns = [0, 0]  # [current, lagging]
        self.tokens = [0, 0]
        self.lag_sum = 0
        self.lag_max = 0

    def add(self, lagging: bool, tokens: int, lag: int) -> None:
        self.turns[lagging] += 1
        self.tokens[lagging] += tokens
        if lagging:
            self.lag_sum += lag
            self.lag_max = max(self.lag_max, lag)

    def metrics(self) -> dict[str, float]:
        return {"rollout/lagging_turn_frac": self.turns[1] / max(sum(self.turns), 1),
                "rollout/lagging_token_frac": self.tokens[1] / max(sum(self.tokens), 1),
                "rollout/lagging_version_lag_mean": self.lag_sum / max(self.turns[1], 1),
                "rollout/lagging_version_lag_max": float(self.lag_max)}

    def as_dict(self) -> dict[str, float]:
        return {"turns_current": float(self.turns[0]), "turns_lagging": float(self.turns[1]),
                "action_tokens_current": float(self.tokens[0]), "action_tokens_lagging": float(self.tokens[1]),
                "lagging_version_lag_max": float(self.lag_max)}
