"""The agent-loop bench's replay: turns recorded per episode, replayed in order on an engine with vLLM's
`add_request`/`step` interface (a scripted stand-in here: milliseconds, no vLLM)."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from pytest import approx

from agentrl.bench.loop_replay import Recording, replay_prompt, replay_turns, stage_figures
from agentrl.rollout.engine import Generation, Handoff


class StepEngine:
    """Generates one token per step per request (token id 1000 + request number), up to its `max_tokens`."""

    def __init__(self) -> None:
        self.running: dict[str, list[Any]] = {}
        self.log: list[tuple[int, str, list[int]]] = []  # (step, request id, prompt) at each add
        self.steps = 0
        self.max_running = 0

    def add_request(self, rid: str, prompt: dict[str, list[int]], n: int) -> None:
        self.log.append((self.steps, rid, list(prompt["prompt_token_ids"])))
        self.running[rid] = [n, []]
        self.max_running = max(self.max_running, len(self.running))

    def step(self) -> list[Any]:
        self.steps += 1
        outs = []
        for rid, (n, toks) in list(self.running.items()):
            toks.append(1000 + len(self.log))
            done = len(toks) >= n
            outs.append(SimpleNamespace(request_id=rid, finished=done, outputs=[SimpleNamespace(token_ids=toks)]))
            if done:
                del self.running[rid]
        return outs


def _episode(first: int, gens: list[int], obs: int = 2) -> list[tuple[list[int], int, int]]:
    """A recorded episode: a `first`-token prompt, each turn generating gens[k] tokens, `obs` tokens between."""
    turns, prompt = [], list(range(first))
    for n in gens:
        turns.append((list(prompt), 32, n))
        prompt = prompt + [500 + i for i in range(n)] + [900 + i for i in range(obs)]
    return turns


def test_turns_run_in_order_with_their_counts_and_at_most_concurrency_episodes() -> None:
    eps = [_episode(4, [3, 1, 2]), _episode(5, [2]), _episode(3, [1, 4]), _episode(6, [2, 2])]
    eng = StepEngine()
    n = replay_turns(eng, eps, 2, params=lambda k: k, tag="t")
    assert n == sum(g for ep in eps for _, _, g in ep) == 17
    assert eng.max_running == 2
    adds = {rid: (step, prompt) for step, rid, prompt in eng.log}
    assert len(adds) == 8
    # episode 0: turn 1 is added after the step that finished turn 0 (3 steps), turn 2 after 1 more
    assert [adds[f"t-0-{k}"][0] for k in range(3)] == [0, 3, 4]
    # episodes 2 and 3 start only when 1 and then 0 end, in the recorded order
    assert adds["t-2-0"][0] == 2 and adds["t-3-0"][0] == 6
    # a later prompt: the replay's own previous prompt + what it sampled + the recorded observation
    step1, p1 = adds["t-0-1"]
    assert len(p1) == len(eps[0][1][0]) and p1[:4] == [0, 1, 2, 3] and p1[-2:] == [900, 901]
    assert all(t >= 1000 for t in p1[4:7])


def test_a_prompt_that_does_not_extend_its_previous_turn_is_replayed_as_recorded() -> None:
    rec = [([1, 2, 3], 8, 2), ([7, 8], 8, 1)]  # the loop rewrote its context
    assert replay_prompt(rec, 1, [1, 2, 3], [40, 41]) == [7, 8]
    assert replay_prompt(rec, 0, [], []) == [1, 2, 3]
    rec = [([1, 2, 3], 8, 2), ([1, 2, 3, 4, 5, 6], 8, 1)]
    assert replay_prompt(rec, 1, [1, 2, 3], [40, 41]) == [1, 2, 3, 40, 41, 6]


class AsyncEngine:
    engine_id, version = 0, 0

    async def generate(self, prompt_ids: list[int], sampling: Any, **context: Any) -> Generation:
        await asyncio.sleep(0.001 * (len(prompt_ids) % 3))
        n = len(prompt_ids) % 4 + 1
        return Generation(list(range(n)), [0.0] * n, "stop", 0, 0)


def test_recording_keeps_each_episodes_turns_in_order() -> None:
    rec = Recording(AsyncEngine())
    s = SimpleNamespace(max_new_tokens=16)

    async def episode(sid: str, start: int) -> None:
        prompt = list(range(start))
        for _ in range(3):
            gen = await rec.generate(prompt, s, session_id=sid)
            prompt = prompt + gen.token_ids + [99]

    async def main() -> None:
        await asyncio.gather(*(episode(f"s{i}", 3 + i) for i in range(5)))

    asyncio.run(main())
    assert list(rec.episodes) == [f"s{i}" for i in range(5)]
    for i, turns in enumerate(rec.episodes.values()):
        assert len(turns) == 3 and len(turns[0][0]) == 3 + i and all(b == 16 for _, b, _ in turns)
        for (p0, _, n0), (p1, _, _) in zip(turns, turns[1:]):
            assert len(p1) == len(p0) + n0 + 1  # each prompt extends the previous turn
    assert rec.generated == sum(n for t in rec.episodes.values() for _, _, n in t)


def test_stage_figures_per_turn_and_busy_share() -> None:
    trajs = [SimpleNamespace(num_turns=2, timings={"generate_s": 1.0, "parse_s": 0.02, "render_s": 0.04}),
             SimpleNamespace(num_turns=2, timings={"generate_s": 3.0, "parse_s": 0.02, "env_s": 0.12})]
    h = Handoff()
    h.count(0.004, 0.002)
    h.count(0.002, 0.0)
    out = stage_figures(trajs, 2.0, h, ("env_s", "generate_s", "parse_s", "render_s"))
    assert out["turn_ms_generate"] == approx(1000.0) and out["turn_ms_parse"] == approx(10.0)
    assert out["turn_ms_env"] == approx(30.0) and out["turn_ms_render"] == approx(10.0)
    assert out["loop_busy_frac"] == approx(0.1)  # 0.2 s of the loop's own work in 2 s
    assert out["handoff_to_engine_ms"] == approx(3.0) and out["handoff_to_loop_ms"] == approx(1.0)
