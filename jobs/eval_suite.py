r"""One model on the paper's evaluation families, whole splits, one table beside the paper's rows.

    python -m jobs.eval_suite runs/smollm2-agentbench --preset smollm2-135m-agentbench --out runs/suite-rl
    python -m jobs.eval_suite models/SmolLM2-135M-Instruct --preset smollm2-135m-agentbench --label untrained \
        --budget-min 60 --sampled-runs 2 --out runs/suite-untrained
    python -m jobs.eval_suite expert --out /tmp/suite-expert                # the scripted experts: the ceilings
    python -m jobs.eval_suite expert --samples 2 --dry-run                  # the plan and its worst case only

Families (agentrl/evaluation/suite_plan.py::FAMILIES): db dev (AgentBench-FC's samples, faithful, MariaDB), os dev
(faithful), kg, alfworld and webshop on the generated test splits (faithful prompts; their original data is not
here), BFCL multi_turn_base (all 200 cases). Each task's own turn limit; max_new_tokens and the context from the
model's config (the run's config.yaml or --preset; --max-new-tokens, --max-model-len), BFCL a context of its own
(--bfcl-context, 8,192 by default, at most the model's own): its first prompts are 3.5-3.8k tokens. Greedy, plus
--sampled-runs K runs at the rollout's temperature. AgentBench's families need a checkout:
AGENTRL_AGENTBENCH_DIR=/path/to/AgentBench.

Every family and mode plays at the same time on the one engine (at most --concurrency episodes in flight across
them, each family at most its own: db 4), or one after another with --sequential. Before playing, each family's
worst case in generated tokens is printed; --budget-min M stops the suite after M minutes of wall time, the
episodes left counted as unfinished and the table marked partial. Results go to
OUT/<family>/ as jobs.eval writes them (the same command resumes them; --fresh replaces them) and the table to
OUT/suite.json and OUT/suite.md.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import shlex
import signal
import sys
from dataclasses import replace
from pathlib import Path

from agentrl.config import ConfigError, load_config
from agentrl.evaluation import suite, suite_plan, suite_table
from agentrl.evaluation.evaluate import Settings
from agentrl.evaluation.services import eval_config, task_options
from agentrl.evaluation.targets import resolve
from agentrl.rollout.agent_loop import EpisodeLimits
from agentrl.rollout.collect import Retry


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", nargs="?", help="run dir (RUN@v<N>), model dir, URL#MODEL, or 'expert'")
    ap.add_argument("overrides", nargs="*", help="section.field=value over the config (model.chat_template=...)")
    ap.add_argument("--version", type=int, help="the run's weights/v<N> (default: the newest)")
    ap.add_argument("--base-url", help="an OpenAI-compatible endpoint")
    ap.add_argument("--model", help="the endpoint's model name")
    ap.add_argument("--api-key-env", default="OPENAI_API_KEY")
    ap.add_argument("--label", help="the model's name in the table")
    ap.add_argument("--preset", help="config preset or YAML for the model's settings (default: the run's config)")
    ap.add_argument("--families", default=",".join(suite_plan.FAMILY_NAMES),
                    help=f"comma-separated, of {', '.join(suite_plan.FAMILY_NAMES)} (default: all)")
    ap.add_argument("--split", action="append", default=[], metavar="FAMILY=SPLIT",
                    help="another split for a family (e.g. db=test: the generated one)")
    ap.add_argument("--task-option", action="append", default=[], metavar="TASK.KEY=VALUE",
                    help="over the suite's own options (YAML value), e.g. db.backend=sqlite")
    ap.add_argument("--protocol", choices=("faithful", "strict"), default="faithful")
    ap.add_argument("--samples", type=int, default=0, help="the first N indices of each split (0: whole splits)")
    ap.add_argument("--sampled-runs", type=int, default=0, help="also this many runs at the rollout's temperature")
    ap.add_argument("--temperature", type=float, help="of the sampled runs (default: the rollout's)")
    ap.add_argument("--max-model-len", type=int, help="the context (default: the config's rollout.max_model_len)")
    ap.add_argument("--max-new-tokens", type=int, help="a turn's tokens (default: rollout.max_new_tokens)")
    ap.add_argument("--bfcl-context", type=int, default=suite_plan.BFCL_CONTEXT,
                    help="BFCL's context (never below --max-model-len; at most the model's own)")
    ap.add_argument("--budget-min", type=float, default=0.0, help="stop after this many minutes (0: no budget)")
    ap.add_argument("--concurrency", type=int,
                    help="episodes at once across the families playing together (default: rollout.concurrency)")
    ap.add_argument("--sequential", action="store_true",
                    help="one family and mode after another instead of all at once on the one engine: slower "
                         "where a family is capped low (db: 4 at once leaves the rest of the batch idle), but a "
                         "tight --budget-min then completes families in order rather than leaving every one "
                         "partial (a partial family's finished episodes lean toward its short ones)")
    ap.add_argument("--family-concurrency", action="append", default=[], metavar="FAMILY=N",
                    help="at most N of a family's episodes at once, its modes together (db on MariaDB: 4 by "
                         "default)")
    ap.add_argument("--dtype", default="float32", help="a local model's vLLM dtype (bfloat16 on a GPU)")
    ap.add_argument("--env-retries", type=int)
    ap.add_argument("--inprocess", action="store_true", help="tasks in this process (no controller, no workers)")
    ap.add_argument("--workers", type=int, help="env workers (default: the config's)")
    ap.add_argument("--out", type=Path, help="default: runs/<name>-suite")
    ap.add_argument("--fresh", action="store_true", help="replace this suite's earlier results in OUT")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and its worst case, play nothing")
    ap.add_argument("--progress", choices=("auto", "bars", "lines"), default="auto",
                    help="bars on a terminal (auto); families playing at once print lines, each named with its mode")
    return ap.parse_intermixed_args(argv)


def _pairs(items: list[str], chosen: list[str], flag: str, what: str) -> dict[str, str]:
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or name not in chosen:
            raise ValueError(f"{flag} {item!r}: write FAMILY={what} for a family of the suite")
        out[name] = value
    return out


def _families(names: str, splits: list[str], at_once: list[str]) -> tuple[suite_plan.Family, ...]:
    known = {f.name: f for f in suite_plan.FAMILIES}
    chosen = [n.strip() for n in names.split(",") if n.strip()]
    if bad := [n for n in chosen if n not in known]:
        raise ValueError(f"--families: unknown {', '.join(bad)} (the suite's: {', '.join(known)})")
    other = _pairs(splits, chosen, "--split", "SPLIT")
    caps = {n: int(v) for n, v in _pairs(at_once, chosen, "--family-concurrency", "N").items()}
    return tuple(replace(known[n], split=other.get(n, known[n].split), concurrency=caps.get(n, known[n].concurrency))
                 for n in chosen)


def _stop(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.target is not None and "=" in args.target and not args.target.startswith(("http://", "https://")):
        args.overrides.insert(0, args.target)
        args.target = None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "openai", "vllm"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        spec = args.base_url or args.target or load_config(args.preset, args.overrides, trains=False).model.path
        if not spec:
            raise ValueError("name a run dir, a model directory, --base-url URL --model NAME, or expert")
        target = resolve(spec, args.version, args.model, args.api_key_env, args.label)
        preset = args.preset or (str(target.run_dir / "config.yaml") if target.run_dir else None)
        if target.model_dir is not None and target.run_dir is None and not any(
                o.startswith("model.path=") for o in args.overrides):
            args.overrides.append(f"model.path={target.model_dir}")
        base = load_config(preset, args.overrides, trains=False)
        families = _families(args.families, args.split, args.family_concurrency)
        options = suite_plan.family_options(families, task_options(args.task_option))
        families = tuple(replace(f, options=options[f.name]) for f in families)
        name = suite_plan.out_name(target)
        out = (args.out or Path(base.run_root) / f"{name}-suite").resolve()
        cfg = eval_config(base, out.name, str(out.parent), [f.name for f in families], args.protocol, options,
                          args.workers, expert=target.expert)
    except (ValueError, FileNotFoundError, ConfigError) as e:
        print(f"jobs.eval_suite: {e}", file=sys.stderr)
        return 2
    r = cfg.rollout
    own = suite_plan.model_context(target.model_dir)
    bfcl = max(args.bfcl_context, args.max_model_len or r.max_model_len)
    if own is not None and bfcl > own:
        print(f"note: BFCL's context is the model's own {own} tokens, not {bfcl}", file=sys.stderr)
        bfcl = own
    settings = Settings(
        temperature=0.0, top_p=1.0,
        limits=EpisodeLimits(0, args.max_model_len or r.max_model_len, args.max_new_tokens or r.max_new_tokens),
        retry=Retry(max_retries=r.env_retries if args.env_retries is None else args.env_retries,
                    capacity_wait_s=r.env_wait_s),
        protocol=args.protocol, tool_parser=cfg.model.tool_parser, chat_template=cfg.model.chat_template,
        stop_tokens=cfg.model.stop_tokens, template_kwargs=tuple(sorted(cfg.model.template_kwargs.items())),
        template_check=r.template_check, kv_cache_gib=cfg.cluster.rollout.cpu_kv_cache_gib, seed=cfg.seed,
        engine_options=(("dtype", args.dtype),))
    temperature = args.temperature if args.temperature is not None else r.temperature
    spec_ = suite_plan.SuiteSpec(families, args.samples, args.sampled_runs, temperature, 1.0,
                                 args.budget_min * 60, args.concurrency or r.concurrency, bfcl, args.sequential)
    label = args.label or target.label
    scale = suite_plan.scale_line(target, suite_plan.model_params(target.model_dir),
                                  suite_plan.device_line(target, args.dtype))
    state = suite.SuiteRun(target, spec_, settings, out, label, scale,
                           shlex.join(["python", "-m", "jobs.eval_suite", *argv]))
    if args.fresh:
        suite.clear(out, target, spec_)
    bars = {"auto": None, "bars": True, "lines": False}[args.progress]
    print(f"suite of {target.describe()} on {', '.join(f'{f.name} {f.split}' for f in families)} "
          f"({' and '.join(m.name for m in spec_.modes)}, {args.protocol} protocol) into {out}", flush=True)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    try:
        summary = asyncio.run(suite.run(cfg, state, args.inprocess, bars, args.dry_run))
    except (KeyboardInterrupt, SystemExit) as e:
        if state.plans:
            suite_table.write(state.summary(interrupted=True), out)
        print(f"stopped; the episodes scored so far are in {out}/<family>/ (the table, partial, in {out}/suite.md): "
              "run the same command to go on", file=sys.stderr)
        return e.code if isinstance(e, SystemExit) and isinstance(e.code, int) else 130
    except (ValueError, FileNotFoundError) as e:  # settings that do not fit a results file, a missing split
        print(f"jobs.eval_suite: {e}", file=sys.stderr)
        return 2
    if summary is None:
        return 0
    print("results (success % [Wilson 95%]):")
    for line in suite_table.result_lines(summary):
        print(line)
    print(f"table: {out}/suite.md, {out}/suite.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
