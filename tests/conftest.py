"""Shared fixtures: a tokenizer built offline from the lookup task's own text."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def lookup_tokenizer():
    """The tokenizer the demo builds (agentrl.models.tiny_policy), from 200 rendered expert episodes of `lookup`."""
    from agentrl.models.tiny_policy import build_tokenizer, expert_conversations

    return build_tokenizer(["lookup"], expert_conversations("lookup", 200, seed=0), 800)


@pytest.fixture(scope="session")
def lookup_format(lookup_tokenizer):
    """That tokenizer's conversation format as the rollout uses it: the tiny model's template, vLLM's hermes
    parser, <|im_end|> and <|endoftext|> as stop tokens, the template check strict."""
    from agentrl.models import tiny_chat
    from agentrl.rollout.chat import ChatFormat

    stops = tuple(lookup_tokenizer.convert_tokens_to_ids(t) for t in (tiny_chat.IM_END, tiny_chat.EOS))
    return ChatFormat.of(lookup_tokenizer, "hermes", stops, check_mode="strict")
