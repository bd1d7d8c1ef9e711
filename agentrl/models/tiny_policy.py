"""The run's own tiny policy, built from its config: a byte-level BPE tokenizer trained on the tasks'
expert conversations and a random-init Qwen2-architecture model, saved as a Hugging Face directory.

The training text is the train split's expert episodes rendered in the tiny chat format, so task words
and numbers become single tokens. Nothing is downloaded. `tiny` builds and saves (knowing nothing of
tasks); this module is where the tasks' text and tools meet it. `jobs/make_model.py` is its command line.
"""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerFast

from agentrl.config import RunConfig
from agentrl.models import tiny
from agentrl.models import tiny_chat as chat
from agentrl.serving.session import Session
from agentrl.tasks import get_task

log = logging.getLogger("agentrl.models.tiny_policy")


def expert_conversations(task_name: str, n: int, seed: int, **options: Any) -> list[str]:
    """Render `n` train-split episodes of the task's scripted expert as chat text (`options`: the task's)."""
    task = get_task(task_name, **options)
    indices = task.indices("train")
    out = []
    for index in random.Random(seed).sample(indices, min(n, len(indices))):
        s = Session(task, index)
        messages = list(s.messages)
        while not s.done:
            msg = s.expert_message()
            res = s.interact(msg)
            messages += [msg, *res.messages]
        out.append(chat.render(messages, task.tools()))
    return out


def build_tokenizer(task_names: list[str], corpus: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """BPE over `corpus`, with the tool-call JSON and every argument key of the tasks' tools as whole tokens."""
    keys = [k for name in task_names for k in chat.argument_key_tokens(get_task(name).tools())]
    whole = list(dict.fromkeys(chat.CALL_SCAFFOLD + keys))
    return tiny.train_tokenizer(corpus, vocab_size, chat.SPECIAL_TOKENS, chat.CHAT_TEMPLATE, chat.EOS, chat.EOS,
                                whole_tokens=whole)


@dataclass(frozen=True)
class BuiltPolicy:
    """What `build_tiny_policy` made: where, and the numbers its log line reports."""

    path: Path
    parameters: int
    vocab: int
    mean_episode_tokens: float
    """Tokens of an expert episode under the new tokenizer, averaged over the first 200 of the corpus."""


def build_tiny_policy(cfg: RunConfig, out: Path, corpus_episodes: int = 1000) -> BuiltPolicy:
    """Tokenizer and model of `cfg.model`'s shape for `cfg.envs.tasks`, saved under `out`."""
    m = cfg.model
    corpus = [text for t in cfg.envs.tasks
              for text in expert_conversations(t, corpus_episodes, cfg.seed, **cfg.envs.task_options.get(t, {}))]
    tok = build_tokenizer(list(cfg.envs.tasks), corpus, m.vocab_size)
    model = tiny.build_model(tok, m.hidden_size, m.num_layers, m.num_heads, m.intermediate_size, m.max_position,
                             cfg.seed, rope_theta=m.rope_theta, copy_init=m.copy_init,
                             stop_tokens=(chat.IM_END, chat.EOS))
    path = tiny.save(model, tok, out, probe=corpus[0])
    lengths = [len(tok.encode(c)) for c in corpus[:200]]
    return BuiltPolicy(path, tiny.num_parameters(model), len(tok), sum(lengths) / len(lengths))
