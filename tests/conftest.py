"""Shared fixtures: a tokenizer built offline from the lookup task's own text."""
from __future__ import annotations

import pytest

from agentrl.models import tiny
from agentrl.rollout import chat


@pytest.fixture(scope="session")
def lookup_tokenizer():
    """The tokenizer the demo builds (jobs/make_model.py), from 200 rendered expert episodes of `lookup`."""
    from jobs.make_model import expert_conversations

    corpus = expert_conversations("lookup", 200, seed=0)
    return tiny.train_tokenizer(corpus, 800, chat.SPECIAL_TOKENS, chat.CHAT_TEMPLATE, chat.EOS, chat.EOS,
                                whole_tokens=chat.CALL_SCAFFOLD)
