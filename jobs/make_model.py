"""Build the tiny policy: a byte-level BPE tokenizer trained on the tasks' own text, and a random-init
Qwen2-architecture model, saved in Hugging Face format (transformers and vLLM load the directory).

    python -m jobs.make_model --run-dir runs/demo            # reads runs/demo/config.yaml, writes runs/demo/model
    srun -n1 python -m jobs.make_model --run-dir $RUN_DIR     # the same inside a Slurm allocation

The training text is the train split's expert conversations rendered in the chat format, so task words
and numbers become single tokens. Nothing is downloaded.
"""
from __future__ import annotations

import argparse
import logging
import random
from pathlib import Path
from typing import Any

from agentrl.config import load_config
from agentrl.envs.api import Session
from agentrl.envs.tasks import get_task
from agentrl.models import tiny
from agentrl.models import tiny_chat as chat

log = logging.getLogger("agentrl.make_model")


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


def build_tokenizer(task_names: list[str], corpus: list[str], vocab_size: int):
    """BPE over `corpus`, with the tool-call JSON and every argument key of the tasks' tools as whole tokens."""
    keys = [k for name in task_names for k in chat.argument_key_tokens(get_task(name).tools())]
    whole = list(dict.fromkeys(chat.CALL_SCAFFOLD + keys))
    return tiny.train_tokenizer(corpus, vocab_size, chat.SPECIAL_TOKENS, chat.CHAT_TEMPLATE, chat.EOS, chat.EOS,
                                whole_tokens=whole)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--out", type=Path, help="default: RUN_DIR/model")
    ap.add_argument("--corpus-episodes", type=int, default=1000)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = load_config(str(args.run_dir / "config.yaml"))
    m = cfg.model
    corpus = [text for t in cfg.envs.tasks
              for text in expert_conversations(t, args.corpus_episodes, cfg.seed, **cfg.envs.task_options.get(t, {}))]
    tok = build_tokenizer(list(cfg.envs.tasks), corpus, m.vocab_size)
    model = tiny.build_model(tok, m.hidden_size, m.num_layers, m.num_heads, m.intermediate_size, m.max_position,
                             cfg.seed, rope_theta=m.rope_theta, copy_init=m.copy_init,
                             stop_tokens=(chat.IM_END, chat.EOS))
    out = tiny.save(model, tok, args.out or args.run_dir / "model", probe=corpus[0])
    lengths = [len(tok.encode(c)) for c in corpus[:200]]
    log.info("model at %s: %d parameters, vocab %d, expert episode %.0f tokens on average", out,
             tiny.num_parameters(model), len(tok), sum(lengths) / len(lengths))


if __name__ == "__main__":
    main()
