"""An engine for tests of the agent loop: fixed replies instead of a model, so that a test decides every turn."""
from __future__ import annotations

from typing import Any

from agentrl.rollout.engine import Generation, SamplingConfig


class ScriptedEngine:
    """Replies with fixed texts, one per turn, in order.

    Log-probs are a fixed -1.0 per token so that tests can tell sampled tokens from context tokens.
    """

    def __init__(self, replies: list[str], tokenizer: Any, engine_id: int = 7, version: int = 3) -> None:
        self._replies = list(replies)
        self._tok = tokenizer
        self.engine_id = engine_id
        self.version = version
        self.prompts: list[list[int]] = []

    async def generate(self, prompt_ids: list[int], sampling: SamplingConfig, **context: Any) -> Generation:
        self.prompts.append(list(prompt_ids))
        text = self._replies.pop(0)
        ids = self._tok.encode(text, add_special_tokens=False)[: sampling.max_new_tokens]
        stopped = bool(ids) and ids[-1] in sampling.stop_token_ids
        return Generation(ids, [-1.0] * len(ids), "stop" if stopped else "length", self.version, self.engine_id)
