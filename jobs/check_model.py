"""Check that a model directory works with agentrl before training it: its chat template, tool parser and
stop tokens, on one scripted-expert episode of each task (no GPU, no weights used).

    python -m jobs.check_model /models/Qwen2.5-7B-Instruct
    python -m jobs.check_model /models/Llama-3.1-8B-Instruct --tasks lookup,db,kg model.tool_parser=llama3_json
    python -m jobs.check_model models/SmolLM2-135M-Instruct model.chat_template=chatml-tools rollout.max_model_len=2048
    python -m jobs.check_model models/SmolLM2-135M-Instruct --preset smollm2-135m   # the settings a run would use
    srun -n1 python -m jobs.check_model $MODEL --tasks os      # where the os sandbox runs

Takes the run's own settings: a preset and `section.field=value` overrides, as jobs.train and jobs.eval do
(model.chat_template, model.tool_parser, model.stop_tokens, model.template_kwargs, rollout.max_model_len,
rollout.max_new_tokens, envs.task_options). Prints the parser chosen and why (what the template writes, the
vocabulary's call tokens, the model type), the stop tokens, and per task the first prompt's length, the
episode's tokens and turns, whether the expert's calls written in the model's syntax came back through the
parser (success, invalid calls), and any mismatch between the episode's tokens and a whole re-render of the
conversation; then whether each first prompt and a turn fit rollout.max_model_len. Exit status 1 when any
task fails (a prompt that does not fit counts when a preset or override set the length) or the template's turn
end is not a stop token, 2 on bad settings.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agentrl.config import ConfigError, load_config
from agentrl.rollout.model_check import TaskCheck, check, turn_end_problem

DEFAULT_TASKS = "lookup,unlock,db,kg,webshop"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", type=Path, nargs="?", help="default: the config's model.path")
    ap.add_argument("overrides", nargs="*", help="section.field=value, e.g. model.chat_template=chatml-tools")
    ap.add_argument("--preset", help="a preset name or YAML whose model and rollout settings to check")
    ap.add_argument("--tasks", default=DEFAULT_TASKS, help=f"comma-separated (default {DEFAULT_TASKS})")
    ap.add_argument("--tool-parser", help="the same as model.tool_parser=NAME")
    ap.add_argument("--chat-template", help="the same as model.chat_template=NAME|PATH")
    ap.add_argument("--stop-tokens", help="the same as model.stop_tokens, comma-separated")
    ap.add_argument("--template-kwargs", help="JSON, the same as model.template_kwargs, e.g. "
                                              "'{\"enable_thinking\": false}'")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_intermixed_args(argv)  # overrides may come before or after the options
    overrides = list(args.overrides)
    if args.model_dir is not None and "=" in str(args.model_dir):  # only overrides were given
        overrides.insert(0, str(args.model_dir))
        args.model_dir = None
    overrides += [f"model.tool_parser={args.tool_parser}"] if args.tool_parser else []
    overrides += [f"model.chat_template={args.chat_template}"] if args.chat_template else []
    overrides += [f"model.stop_tokens={json.dumps([t for t in args.stop_tokens.split(',') if t])}"] \
        if args.stop_tokens else []
    overrides += [f"model.template_kwargs={args.template_kwargs}"] if args.template_kwargs else []
    tasks = [t for t in args.tasks.split(",") if t]
    try:
        path = [f"model.path={args.model_dir}"] if args.model_dir is not None else []
        cfg = load_config(args.preset, overrides + path, trains=False)
        if not cfg.model.path:
            raise ValueError("name a model directory (or model.path=DIR)")
        model_dir = Path(cfg.model.path)
        fmt, results = check(model_dir, tasks, cfg.model, cfg.envs.task_options)
    except (ValueError, OSError, ConfigError) as e:
        print(f"check_model: {e}", file=sys.stderr)
        return 2
    length_set = bool(args.preset) or any(o.startswith(("rollout.max_model_len", "rollout.max_new_tokens"))
                                          for o in overrides)
    failed = _print(model_dir, fmt, results, cfg, length_set)
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ if isinstance(r, TaskCheck) else {"task": r[0], "error": r[1]}
                                         for r in results], indent=2))
    print("all tasks passed" if not failed else f"{failed} task(s) failed")
    return 1 if failed else 0


def _print(model_dir: Path, fmt, results: list, cfg, length_set: bool) -> int:
    tok = fmt.tokenizer
    m, r = cfg.model, cfg.rollout
    print(f"model      {model_dir}")
    source = f"model.chat_template={m.chat_template}" if m.chat_template else "the directory's own"
    print(f"template   {source}")
    print(f"parser     {fmt.parser.name}   (serve with --enable-auto-tool-choice --tool-call-parser {fmt.parser.name})")
    print(f"           {fmt.parser_note}")
    print(f"stops      {', '.join(f'{tok.convert_ids_to_tokens(i)} ({i})' for i in fmt.stop_ids)}")
    problem = turn_end_problem(fmt)
    print(f"turn end   {tok.convert_ids_to_tokens(fmt.turn_end)} ({fmt.turn_end}), a stop token" if problem is None
          else f"turn end   {problem}   <- FAILED")
    print(f"{'task':10} {'prompt':>7} {'tokens':>7} {'turns':>5} {'success':>7} {'invalid':>7}  template")
    failed = int(problem is not None)
    for x in results:
        if isinstance(x, TaskCheck):
            failed += not x.ok
            print(f"{x.task:10} {x.prompt_tokens:7d} {x.episode_tokens:7d} {x.turns:5d} {x.success:7.2f} "
                  f"{x.invalid_calls:7d}  {'ok' if not x.mismatches else '; '.join(x.mismatches)}"
                  f"{'' if x.ok else '   <- FAILED (' + x.status + ')'}")
        else:
            failed += 1
            print(f"{x[0]:10} could not run: {x[1]}")
    checked = [x for x in results if isinstance(x, TaskCheck)]
    over = [x for x in checked if x.prompt_tokens + r.max_new_tokens > r.max_model_len]
    where = "" if length_set else " (the defaults; set them with --preset or rollout.* overrides)"
    print(f"length     rollout.max_model_len {r.max_model_len}, max_new_tokens {r.max_new_tokens}{where}: "
          + ("every first prompt and a turn fit" if not over else
             "too short for " + ", ".join(f"{x.task} (prompt {x.prompt_tokens})" for x in over)
             + f"; needs >= {max(x.prompt_tokens for x in over) + r.max_new_tokens}"))
    return failed + (len(over) if length_set else 0)


if __name__ == "__main__":
    sys.exit(main())
