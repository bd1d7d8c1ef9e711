r"""Evaluate a run's weights, a model directory or an OpenAI-compatible endpoint on the tasks' held-out split.

    python -m jobs.eval runs/demo                                  # its newest weights/v<N>, tasks from its config
    python -m jobs.eval runs/demo --version 12 --greedy            # v12, temperature 0, one run
    python -m jobs.eval /models/qwen2.5-7b --tasks os,db --samples 100 --runs 4
    python -m jobs.eval --base-url http://127.0.0.1:8000/v1 --model policy --tasks lookup --inprocess
    python -m jobs.eval runs/demo@v30 --cross runs/demo@v10 --cross-prob 0.5 --runs 8   # pass@k curves
    python -m jobs.eval expert --tasks bfcl --samples 20 --greedy      # the scripted expert: env + grader check
    python -m jobs.eval models/SmolLM2-135M-Instruct model.chat_template=chatml-tools rollout.max_model_len=4096 \
        --tasks lookup --inprocess                           # a model's settings: the run's own overrides
Under Slurm (one node; jobs.eval starts the controller and env workers beside its engine):
    srun --ntasks=1 --cpus-per-task=16 --gpus-per-task=1 python -m jobs.eval runs/demo --progress lines
    python -m jobs.eval runs/demo --render-sbatch --slurm-partition gpu > eval.sbatch && sbatch eval.sbatch
    python -m jobs.launch --eval runs/demo --slurm-partition gpu        # the same job, submitted

A local model is played with the model settings a run takes (model.chat_template, model.tool_parser,
model.stop_tokens, model.template_kwargs): the evaluated run's config.yaml, or --preset, with the same
`section.field=value` overrides on top. rollout.max_model_len bounds each episode (--max-model-len says the
same); an evaluation whose first prompts cannot fit it with a turn is refused, naming both numbers.
Results go to runs/<name>-eval/ (or --out): <stem>.jsonl (one line per episode; the same command run again
skips what is scored: stop it whenever), <stem>.{txt,json,csv,md} (the md in AgentBench-FC's layout beside
the paper's numbers), <stem>.transcripts.jsonl.gz (every episode's messages, tool calls and observations:
`python -m jobs.show_trajectories OUT --task db --status turn_limit`), logs/ of the env roles. Success is
the mean of --runs runs (default 4, the paper's) with a 95% t-interval, pass@k for k <= runs; env errors are
retried, then counted as failures and reported.
AgentBench tasks run AgentBench-FC's faithful protocol unless --protocol strict. `python -m jobs.report RUN
--eval OUT/<stem>.jsonl` adds the results to a run's report.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import re
import shutil
import signal
import sys
from pathlib import Path

from agentrl.config import ConfigError, load_config
from agentrl.evaluation.eval_job import add_slurm_arguments, eval_argv, job_of, render
from agentrl.evaluation.evaluate import Settings, evaluate, evaluate_cross
from agentrl.evaluation.runner import EvalScope
from agentrl.evaluation.services import env_client, eval_config, task_options
from agentrl.evaluation.targets import Target, resolve
from agentrl.rollout.agent_loop import EpisodeLimits
from agentrl.rollout.collect import Retry


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", nargs="?", help="run dir (RUN@v<N> for a version), model dir, URL#MODEL, or 'expert' "
                                              "(the tasks' scripted experts: the env's and grader's ceiling); "
                                              "default: the config's model.path")
    ap.add_argument("overrides", nargs="*", help="section.field=value over the config, as jobs.train takes them: "
                                                 "model.chat_template=chatml-tools model.tool_parser=hermes ...")
    ap.add_argument("--version", type=int, help="the run's weights/v<N> (default: the newest)")
    ap.add_argument("--base-url", help="an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    ap.add_argument("--model", help="the endpoint's model name")
    ap.add_argument("--api-key-env", default="OPENAI_API_KEY", help="the environment variable holding the API key")
    ap.add_argument("--label", help="the model's name in the tables")
    ap.add_argument("--preset", help="config preset or YAML for the env and rollout settings (default: the run's "
                                     "own config.yaml, else the defaults)")
    ap.add_argument("--tasks", help="comma-separated (default: the config's envs.tasks)")
    ap.add_argument("--split", default="test")
    ap.add_argument("--samples", type=int, default=0, help="the first N indices of each task (0: all)")
    ap.add_argument("--runs", type=int, default=4, help="each index played this many times (mean of k runs)")
    ap.add_argument("--greedy", action="store_true", help="temperature 0 and one run (runs would be identical)")
    ap.add_argument("--temperature", type=float, help="default: the rollout's")
    ap.add_argument("--top-p", type=float)
    ap.add_argument("--protocol", choices=("faithful", "strict"), default="faithful",
                    help="AgentBench tasks' protocol (faithful: AgentBench-FC's own loop, the paper's)")
    ap.add_argument("--task-option", action="append", default=[], metavar="TASK.KEY=VALUE",
                    help="a task constructor option (YAML value), e.g. db.backend=mariadb")
    ap.add_argument("--max-turns", type=int, help="global turn cap (default: the config's; 0: each task's limit)")
    ap.add_argument("--max-model-len", type=int)
    ap.add_argument("--max-new-tokens", type=int)
    ap.add_argument("--concurrency", type=int, default=32, help="episodes at once")
    ap.add_argument("--dtype", default="float32", help="a local model's vLLM dtype (bfloat16 on a GPU)")
    ap.add_argument("--env-retries", type=int, help="more attempts after an env error (default: the config's)")
    ap.add_argument("--inprocess", action="store_true", help="tasks in this process (no controller, no workers)")
    ap.add_argument("--workers", type=int, help="env workers (default: the config's)")
    ap.add_argument("--cross", metavar="TARGET", help="cross-sample with this second target (A = target, B = this)")
    ap.add_argument("--cross-prob", type=float, default=0.5, help="probability that a turn goes to B")
    ap.add_argument("--out", type=Path, help="default: runs/<name>-eval")
    ap.add_argument("--fresh", action="store_true", help="replace this command's earlier results")
    ap.add_argument("--bootstrap", type=int, default=0, help="bootstrap resamples for a second interval (0: off)")
    ap.add_argument("--progress", choices=("auto", "bars", "lines"), default="auto")
    add_slurm_arguments(ap)
    return ap.parse_intermixed_args(argv)  # overrides may come before or after the options


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "model"


def _stop(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.target is not None and "=" in args.target and not args.target.startswith(("http://", "https://")):
        args.overrides.insert(0, args.target)  # only overrides were given
        args.target = None
    if args.render_sbatch:
        print(render(job_of(argv), eval_argv(argv)), end="")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "openai", "vllm"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        spec = args.base_url or args.target
        if not spec:
            spec = load_config(args.preset, args.overrides, trains=False).model.path
        if not spec:
            raise ValueError("name a run dir, a model directory (or model.path=DIR), or --base-url URL --model NAME")
        target = resolve(spec, args.version, args.model, args.api_key_env, args.label)
        other = resolve(args.cross, None, None, args.api_key_env) if args.cross else None
        if other is not None and (target.expert or other.expert):
            raise ValueError("--cross samples two policies' turns; the scripted expert is not one")
        preset = args.preset or (str(target.run_dir / "config.yaml") if target.run_dir else None)
        if target.model_dir is not None and target.run_dir is None and not any(
                o.startswith("model.path=") for o in args.overrides):  # the model dir is the config's model
            args.overrides.append(f"model.path={target.model_dir}")
        try:
            base = load_config(preset, args.overrides, trains=False)
        except ConfigError as e:
            if args.preset or args.overrides:
                raise
            raise ConfigError(f"{preset}: {e} (a config another version of agentrl wrote? name the env settings "
                              "with --preset)") from e
        tasks = tuple(args.tasks.split(",")) if args.tasks else base.envs.tasks
        name = slug(target.run_dir.name if target.run_dir else target.label)
        out = (args.out or Path(base.run_root) / f"{name}-eval").resolve()
        cfg = eval_config(base, out.name, str(out.parent), tasks, args.protocol, task_options(args.task_option),
                          args.workers, expert=target.expert)
    except (ValueError, FileNotFoundError, ConfigError) as e:
        print(f"jobs.eval: {e}", file=sys.stderr)
        return 2
    r = cfg.rollout
    temperature = 0.0 if args.greedy else (args.temperature if args.temperature is not None else r.temperature)
    runs = 1 if args.greedy else args.runs
    settings = Settings(
        temperature=temperature, top_p=1.0 if temperature == 0 else (args.top_p or r.top_p),
        limits=EpisodeLimits(r.max_turns if args.max_turns is None else args.max_turns,
                             args.max_model_len or r.max_model_len, args.max_new_tokens or r.max_new_tokens),
        retry=Retry(max_retries=r.env_retries if args.env_retries is None else args.env_retries,
                    capacity_wait_s=r.env_wait_s),
        protocol=args.protocol, tool_parser=cfg.model.tool_parser, chat_template=cfg.model.chat_template,
        stop_tokens=cfg.model.stop_tokens, template_kwargs=tuple(sorted(cfg.model.template_kwargs.items())),
        template_check=r.template_check,
        kv_cache_gib=cfg.cluster.rollout.cpu_kv_cache_gib, seed=cfg.seed, engine_options=(("dtype", args.dtype),))
    if temperature == 0 and runs > 1:
        print(f"note: at temperature 0 the {runs} runs play the same tokens; --greedy plays one", file=sys.stderr)
    scope = EvalScope(tuple(cfg.envs.tasks), args.split, args.samples, runs, args.concurrency)
    stem = f"{'cross' if other else 'eval'}-{args.split}" + (f"-v{target.version}" if target.version is not None
                                                            else "") + ("-greedy" if temperature == 0 else "")
    if args.fresh:
        for p in out.glob(f"{stem}*"):
            p.unlink() if p.is_file() else shutil.rmtree(p)
    bars = {"auto": None, "bars": True, "lines": False}[args.progress]
    print(f"evaluating {target.describe()}" + (f" crossed with {other.describe()} (p={args.cross_prob:g})"
                                               if other else "")
          + f" on {', '.join(scope.tasks)} ({args.split}, {runs} run{'s' * (runs > 1)}, temperature {temperature:g},"
          f" {args.protocol} protocol) into {out}", flush=True)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    try:
        table = asyncio.run(_run(cfg, out, args.inprocess, target, other, args.cross_prob, scope, settings, stem,
                                 bars, args.bootstrap))
    except (KeyboardInterrupt, SystemExit) as e:
        print(f"stopped; the episodes scored so far are in {out}/{stem}*.jsonl: run the same command to go on",
              file=sys.stderr)
        return e.code if isinstance(e, SystemExit) and isinstance(e.code, int) else 130
    except (ValueError, FileNotFoundError) as e:  # settings that do not fit the results file, a task without samples
        print(f"jobs.eval: {e}", file=sys.stderr)
        return 2
    print(table)
    print(f"tables: {out}/{stem}.{{txt,json,csv,md}}" if not other else f"curves: {out}/{stem}-curves.{{md,json}}")
    return 0


async def _run(cfg, out: Path, inprocess: bool, target: Target, other: Target | None, prob: float, scope: EvalScope,
               settings: Settings, stem: str, bars: bool | None, bootstrap: int) -> str:
    async with env_client(cfg, out, inprocess) as client:
        if other is not None:
            return await evaluate_cross(client, target, other, prob, scope, settings, out, stem, bars)
        return await evaluate(client, target, scope, settings, out, stem, bars, bootstrap)


if __name__ == "__main__":
    sys.exit(main())
