r"""Export a run's policy as a Hugging Face model directory (config, generation config, tokenizer with its
chat template, safetensors in the model's dtype) that transformers, vLLM and vLLM's OpenAI server load.

    python -m jobs.export runs/demo exported/demo                 # the newest version there is
    python -m jobs.export runs/demo --version 12 exported/demo-v12   # from weights/v12, else its checkpoint
    srun -n1 python -m jobs.export $RUN_DIR $OUT

Serve it (the parser `jobs.check_model` prints for the model):

    python -m vllm.entrypoints.openai.api_server --model exported/demo --enable-auto-tool-choice \
        --tool-call-parser hermes
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentrl.trainer.export import export


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--version", type=int, help="policy version (default: the newest published or checkpointed)")
    args = ap.parse_args(argv)
    try:
        out, version, source = export(args.run_dir, args.out, args.version)
    except (FileNotFoundError, FileExistsError) as e:
        print(f"export: {e}", file=sys.stderr)
        return 2
    print(f"exported v{version} of {args.run_dir} from its {source} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
