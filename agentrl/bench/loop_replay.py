"""The agent loop's turn structure, recorded and replayed on a bare engine (`jobs.bench_agent_loop`).

Comparing our loop with one `generate` call over all its requests mixes two things: our per-turn cost, and the
turn structure itself (a turn cannot start before the previous one returned, so fewer sequences share each
step). The replay keeps the structure and drops our code: each recorded episode's turns in order, the next
added the moment the previous one finishes, as many episodes at once as the loop ran, each turn generating as
many tokens as the loop's did. Loop over replay is then what our own work per turn costs.

`Recording` wraps an engine of ours and keeps, per episode, every turn's prompt, budget and generated count;
`replay_turns` drives any object with vLLM's `LLMEngine` interface (`add_request`, `step`) through them.
Pure Python: importing this module starts nothing and needs neither torch nor vLLM.
"""
from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

Turn = tuple[list[int], int, int]
"""One recorded turn: (prompt ids, token budget, tokens generated)."""


class Recording:
    """An engine that remembers every request it served, episode by episode (keyed by the session id the agent
    loop passes, else by the asyncio task), in the episodes' order of first request: the order `collect`
    admitted them."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.engine_id, self.version = engine, engine.engine_id, engine.version
        self.episodes: dict[str, list[Turn]] = {}
        self.generated = 0

    async def generate(self, prompt_ids: list[int], sampling: Any, **context: Any) -> Any:
        key = str(context.get("session_id") or id(asyncio.current_task()))
        turns = self.episodes.setdefault(key, [])  # before the await: an episode's place is its first request
        prompt = list(prompt_ids)
        gen = await self.engine.generate(prompt_ids, sampling, **context)
        turns.append((prompt, sampling.max_new_tokens, len(gen.token_ids)))
        self.generated += len(gen.token_ids)
        return gen


def replay_prompt(recorded: Sequence[Turn], k: int, prev_prompt: list[int], prev_sampled: list[int]) -> list[int]:
    """Turn k's prompt in the replay: the replay's own turn k-1 (its prompt and the tokens it sampled) and then
    what the episode appended after its turn k-1 (the observation), so that a later turn finds the replay's own
    earlier tokens in the prefix cache, as the loop's turns find theirs. The recorded prompt itself when it does
    not extend the previous turn (a loop that rewrote its context) or at turn 0."""
    prompt = recorded[k][0]
    if k == 0:
        return list(prompt)
    before, _, n_before = recorded[k - 1]
    cut = len(before) + n_before
    if len(prompt) < cut or len(prev_sampled) != n_before or len(prev_prompt) != len(before):
        return list(prompt)
    return prev_prompt + prev_sampled + prompt[cut:]


def replay_turns(engine: Any, episodes: Sequence[Sequence[Turn]], concurrency: int,
                 params: Callable[[int], Any], tag: str = "replay") -> int:
    """Drive `engine` (vLLM's `LLMEngine` interface) through `episodes`: turn k+1 of an episode is added right
    after the step that finished its turn k, at most `concurrency` episodes at once, the next one starting when
    one ends (in the recorded order). `params(n)`: the sampling parameters of a turn that generates n tokens.

    Returns:
        The number of tokens generated.
    """
    waiting = collections.deque(range(len(episodes)))
    turn: dict[int, int] = {}  # episode -> its turn in flight
    prompts: dict[int, list[int]] = {}
    requests: dict[str, int] = {}
    generated = 0

    def submit(e: int, prev_sampled: list[int]) -> None:
        k = turn[e]
        prompts[e] = replay_prompt(episodes[e], k, prompts.get(e, []), prev_sampled)
        rid = f"{tag}-{e}-{k}"
        requests[rid] = e
        engine.add_request(rid, {"prompt_token_ids": prompts[e]}, params(episodes[e][k][2]))

    while waiting or turn:
        while waiting and len(turn) < concurrency:
            e = waiting.popleft()
            if not episodes[e]:
                continue
            turn[e] = 0
            submit(e, [])
        for out in engine.step():
            if not out.finished:
                continue
            e = requests.pop(out.request_id)
            sampled = list(out.outputs[0].token_ids)
            generated += len(sampled)
            turn[e] += 1
            if turn[e] < len(episodes[e]):
                submit(e, sampled)
            else:
                del turn[e]
    return generated


def stage_figures(trajs: Sequence[Any], wall_s: float, handoff: Any, stages: Sequence[str]) -> dict[str, float]:
    """Where the loop's time went: each of `stages` (`agent_loop.STAGES`, summed over the episodes' `timings`)
    per turn in ms, the share of `wall_s` that the event loop's thread spent on everything but waiting for
    generations (parse, render, build, check, and env calls: in-process envs run on that thread), and the
    engine hand-offs per request (`engine.Handoff`)."""
    turns = max(1, sum(t.num_turns for t in trajs))
    sums = {k: sum(t.timings.get(k, 0.0) for t in trajs) for k in stages}
    out = {f"turn_ms_{k.removesuffix('_s')}": 1e3 * v / turns for k, v in sums.items()}
    out["loop_busy_frac"] = sum(v for k, v in sums.items() if k != "generate_s") / wall_s if wall_s > 0 else 0.0
    out["handoff_to_engine_ms"] = 1e3 * handoff.to_engine_s / max(1, handoff.requests)
    out["handoff_to_loop_ms"] = 1e3 * handoff.to_loop_s / max(1, handoff.requests)
    return out


def profile_top(prof: Any, n: int = 30) -> list[dict[str, Any]]:
    """The `n` functions with the most time of their own in a `cProfile.Profile` (which sees the thread it was
    enabled on: the event loop's, not the engine thread's stepping)."""
    import pstats

    rows = sorted(pstats.Stats(prof).stats.items(), key=lambda kv: -kv[1][2])[:n]  # type: ignore[attr-defined]
    return [{"function": f"{Path(f).name}:{line}({name})", "calls": nc, "own_s": round(tt, 4), "cum_s": round(ct, 4)}
            for (f, line, name), (_, nc, tt, ct, _) in rows]
