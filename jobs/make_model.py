"""Build the tiny policy: a byte-level BPE tokenizer trained on the tasks' own text, and a random-init
Qwen2-architecture model, saved in Hugging Face format (transformers and vLLM load the directory).

    python -m jobs.make_model --run-dir runs/demo            # reads runs/demo/config.yaml, writes runs/demo/model
    srun -n1 python -m jobs.make_model --run-dir $RUN_DIR     # the same inside a Slurm allocation

The training text is the train split's expert conversations rendered in the chat format, so task words
and numbers become single tokens. Nothing is downloaded. The library is `agentrl.models.tiny_policy`.
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

from agentrl.config import load_config
from agentrl.models.tiny_policy import build_tiny_policy

log = logging.getLogger("agentrl.make_model")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--out", type=Path, help="default: RUN_DIR/model")
    ap.add_argument("--corpus-episodes", type=int, default=1000)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = load_config(str(args.run_dir / "config.yaml"))
    built = build_tiny_policy(cfg, args.out or args.run_dir / "model", args.corpus_episodes)
    log.info("model at %s: %d parameters, vocab %d, expert episode %.0f tokens on average", built.path,
             built.parameters, built.vocab, built.mean_episode_tokens)


if __name__ == "__main__":
    main()
