"""Check that a model directory works with agentrl before training it: its chat template, tool parser and
stop tokens, on one scripted-expert episode of each task (no GPU, no weights used).

    python -m jobs.check_model /models/Qwen2.5-7B-Instruct
    python -m jobs.check_model /models/Llama-3.1-8B-Instruct --tasks lookup,db,kg --tool-parser llama3_json
    srun -n1 python -m jobs.check_model $MODEL --tasks os      # where the os sandbox runs

Prints the parser chosen (`model.tool_parser: auto` picks it the same way), the stop tokens, and per task
the first prompt's length, the episode's tokens and turns, whether the expert's calls written in the
model's syntax came back through the parser (success, invalid calls), and any mismatch between the
episode's tokens and a whole re-render of the conversation. Exit status 1 when any task fails.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agentrl.rollout.model_check import TaskCheck, check

DEFAULT_TASKS = "lookup,unlock,db,kg,webshop"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--tasks", default=DEFAULT_TASKS, help=f"comma-separated (default {DEFAULT_TASKS})")
    ap.add_argument("--tool-parser", default="auto", help="vLLM tool parser (default: auto, as model.tool_parser)")
    ap.add_argument("--stop-tokens", default="", help="extra stop tokens, comma-separated (model.stop_tokens)")
    ap.add_argument("--template-kwargs", default="{}", help='JSON, e.g. \'{"enable_thinking": false}\'')
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    stops = tuple(t for t in args.stop_tokens.split(",") if t)
    try:
        fmt, results = check(args.model_dir, [t for t in args.tasks.split(",") if t], args.tool_parser, stops,
                             json.loads(args.template_kwargs))
    except (ValueError, OSError) as e:
        print(f"check_model: {e}", file=sys.stderr)
        return 2
    tok = fmt.tokenizer
    print(f"model      {args.model_dir}")
    print(f"parser     {fmt.parser.name}   (serve with --enable-auto-tool-choice --tool-call-parser {fmt.parser.name})")
    print(f"stops      {', '.join(f'{tok.convert_ids_to_tokens(i)} ({i})' for i in fmt.stop_ids)}")
    print(f"{'task':10} {'prompt':>7} {'tokens':>7} {'turns':>5} {'success':>7} {'invalid':>7}  template")
    failed = 0
    for r in results:
        if isinstance(r, TaskCheck):
            failed += not r.ok
            print(f"{r.task:10} {r.prompt_tokens:7d} {r.episode_tokens:7d} {r.turns:5d} {r.success:7.2f} "
                  f"{r.invalid_calls:7d}  {'ok' if not r.mismatches else '; '.join(r.mismatches)}"
                  f"{'' if r.ok else '   <- FAILED (' + r.status + ')'}")
        else:
            failed += 1
            print(f"{r[0]:10} could not run: {r[1]}")
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ if isinstance(r, TaskCheck) else {"task": r[0], "error": r[1]}
                                         for r in results], indent=2))
    print("all tasks passed" if not failed else f"{failed} task(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
