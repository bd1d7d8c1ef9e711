"""Shared fixtures: a tokenizer built offline from the lookup task's own text."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def lookup_tokenizer():
    """The tokenizer the demo builds (jobs/make_model.py), from 200 rendered expert episodes of `lookup`."""
    from jobs.make_model import build_tokenizer, expert_conversations

    return build_tokenizer(["lookup"], expert_conversations("lookup", 200, seed=0), 800)
