"""Shared fixtures: a tokenizer built offline from the lookup task's own text."""
from __future__ import annotations

import pytest

from agentrl.models import tiny
from agentrl.rollout import chat


@pytest.fixture(scope="session")
def lookup_tokenizer():
    """The tokenizer the demo would build, trained on 200 rendered expert episodes of `lookup`."""
    from agentrl.envs.api import Session
    from agentrl.envs.tasks import get_task

    task = get_task("lookup")
    corpus = []
    for index in task.indices("train")[:200]:
        s = Session(task, index)
        msgs = list(s.messages)
        while not s.done:
            m = s.expert_message()
            msgs += [m, *s.interact(m).messages]
        corpus.append(chat.render(msgs, task.tools()))
    return tiny.train_tokenizer(corpus, 800, chat.SPECIAL_TOKENS, chat.CHAT_TEMPLATE, chat.EOS, chat.EOS)
