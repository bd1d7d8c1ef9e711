"""Cross-sampling evaluation (the paper's pass@k figure): two policies A and B compared as pass@k curves.

    single A / single B   k samples of one policy
    mix                   k samples, ceil(k/2) from A and floor(k/2) from B (each episode one policy)
    cross                 k samples of episodes whose every turn goes to B with probability p, else to A

If cross beats mix at equal k, mixing the policies inside an episode explores what neither finds alone,
which is what cross-policy sampling during training relies on. pass@k of each arm is the unbiased estimator
per sample, averaged over samples; mix combines A's and B's estimates of disjoint draws: the k samples fail
together only if both halves fail, 1 - (1 - pass@ceil(k/2)_A)(1 - pass@floor(k/2)_B) per sample.

Math here is pure; playing the arms is `players` with an `EnginePool` (two local models of one chat
format: token level, as in training) or a `RoutedEndpoint` (message level: any two of a local model and
an endpoint).
"""
from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from agentrl.evaluation.endpoint import Reply
from agentrl.monitor.eval_results import ScoredEpisode
from agentrl.monitor.eval_stats import pass_at_k

ARMS = ("A", "B", "cross")


def mix_pass_at_k(n_a: int, c_a: int, n_b: int, c_b: int, k: int) -> float:
    """pass@k of k draws of which ceil(k/2) come from A's n_a samples (c_a successes) and floor(k/2) from
    B's; a half of size 0 never succeeds."""
    ka, kb = (k + 1) // 2, k // 2
    fail_a = 1.0 - pass_at_k(n_a, c_a, ka)
    fail_b = 1.0 - pass_at_k(n_b, c_b, kb) if kb else 1.0
    return 1.0 - fail_a * fail_b


def _counts(episodes: Iterable[ScoredEpisode]) -> dict[tuple[str, str, str], tuple[int, int]]:
    """(n, c) per (task, split, index)."""
    n: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])
    for e in episodes:
        v = n[(e.task, e.split, e.index)]
        v[0] += 1
        v[1] += e.success > 0.5
    return {k: (a, b) for k, (a, b) in n.items()}


def curves(arms: Mapping[str, Iterable[ScoredEpisode]], max_k: int) -> dict[str, dict[str, list[float]]]:
    """pass@k for k = 1..K per task and arm: {task: {"single A": [...], "single B": [...], "mix": [...],
    "cross": [...]}}, K the largest k every arm's every index has samples for (at most `max_k`). Only
    the indices that all three arms scored enter (a partial evaluation compares like with like)."""
    counts = {arm: _counts(arms.get(arm, ())) for arm in ARMS}
    common = set(counts["A"]) & set(counts["B"]) & set(counts["cross"])
    out: dict[str, dict[str, list[float]]] = {}
    for task in sorted({k[0] for k in common}):
        keys = sorted(k for k in common if k[0] == task)
        k_max = min([max_k] + [counts[arm][key][0] for arm in ARMS for key in keys])
        # mix needs ceil(k/2) of A and floor(k/2) of B: always within each arm's count when k <= that count
        ks = range(1, k_max + 1)

        def mean(f: Any, keys: list[tuple[str, str, str]] = keys, ks: range = ks) -> list[float]:
            return [sum(f(key, k) for key in keys) / len(keys) for k in ks]

        out[task] = {
            "single A": mean(lambda key, k: pass_at_k(*counts["A"][key], k)),
            "single B": mean(lambda key, k: pass_at_k(*counts["B"][key], k)),
            "mix": mean(lambda key, k: mix_pass_at_k(*counts["A"][key], *counts["B"][key], k)),
            "cross": mean(lambda key, k: pass_at_k(*counts["cross"][key], k)),
        }
    return out


def curves_markdown(c: Mapping[str, Mapping[str, list[float]]], label_a: str, label_b: str, prob: float) -> str:
    """A markdown table per task: one row per arm, pass@k columns."""
    lines = [f"Cross-sampling: A = {label_a}, B = {label_b}, cross = each turn from B with p = {prob:g}", ""]
    for task, arms in c.items():
        ks = len(next(iter(arms.values())))
        lines += [f"**{task}**", "", "| arm | " + " | ".join(f"pass@{k}" for k in range(1, ks + 1)) + " |",
                  "|---|" + "---|" * ks]
        lines += [f"| {arm} | " + " | ".join(f"{100 * v:.1f}" for v in vals) + " |" for arm, vals in arms.items()]
        lines.append("")
    return "\n".join(lines)


class RoutedEndpoint:
    """Two message-level policies as one: each turn goes to `b` with probability `prob`, else to `a`,
    from a seeded RNG (one draw per turn, as `EnginePool.route`). Counts the turns each took."""

    def __init__(self, a: Any, b: Any, prob: float, seed: int | str = 0) -> None:
        if not 0.0 <= prob <= 1.0:
            raise ValueError(f"cross-sampling probability must be in [0, 1], got {prob}")
        self.a, self.b, self.prob = a, b, prob
        self._rng = random.Random(seed)
        self.turns = [0, 0]

    async def reply(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], max_tokens: int,
                    temperature: float, top_p: float) -> Reply:
        use_b = self._rng.random() < self.prob
        self.turns[use_b] += 1
        return await (self.b if use_b else self.a).reply(messages, tools, max_tokens, temperature, top_p)


class LocalChat:
    """A local engine behind the endpoint's `reply`: the conversation rendered by the model's chat template,
    one generation, its tool calls parsed by the model's parser. For crossing a local model with an endpoint
    at the message level; a local model alone is evaluated through the token-level agent loop instead."""

    def __init__(self, engine: Any, fmt: Any, max_model_len: int) -> None:
        self.engine, self.fmt, self.max_model_len = engine, fmt, max_model_len
        self._turn = 0

    async def reply(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], max_tokens: int,
                    temperature: float, top_p: float) -> Reply:
        from agentrl.evaluation.endpoint import ContextTooLong
        from agentrl.rollout.engine import SamplingConfig

        prompt = self.fmt.prompt_ids(messages, tools)
        room = self.max_model_len - len(prompt)
        if room < 2:
            raise ContextTooLong(f"{len(prompt)} prompt tokens of {self.max_model_len}")
        s = SamplingConfig(min(max_tokens, room - 1), temperature, top_p, self.fmt.stop_ids)
        gen = await self.engine.generate(prompt, s, tools=tools, fmt=self.fmt)
        self._turn += 1
        parsed = self.fmt.parse(gen.token_ids, tools, call_id_prefix=f"call_{self._turn}")
        msg = parsed.to_message()
        if parsed.errors:  # unreadable calls: the text goes to the env as a message without a call
            msg = {"role": "assistant", "content": self.fmt.decode(gen.token_ids[:-1] if gen.finish_reason == "stop"
                                                                   else gen.token_ids)}
        finish = "length" if gen.finish_reason == "length" else "tool_calls" if msg.get("tool_calls") else "stop"
        return Reply(msg, finish, len(prompt), len(gen.token_ids))
