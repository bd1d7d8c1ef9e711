"""Measure a model's warm-start learning rate before training it: a short range test on the scripted experts'
demonstrations of the config's tasks (`agentrl.trainer.lr_range`: the rule is in its docstring).

    python -m jobs.lr_range models/SmolLM2-135M-Instruct --preset smollm2-135m
    python -m jobs.lr_range /models/my-base --preset smollm2-135m model.chat_template=chatml-tools --steps 3
    python -m jobs.lr_range /models/my-base --preset smollm2-135m --rates 1e-5,1e-4,1e-3 --batch 4 --full
    srun -n1 --gpus=1 python -m jobs.lr_range $MODEL --preset agentbench-qwen2.5-7b --tasks db,kg

The experts' episodes are played in this process through the model's own chat format (no workers, no engine:
tasks that need a sandbox of their own, such as os, are left to --tasks), then, as the warm start would use them
(`trainer.warm_start_successful_only`, the preset's freeze_layers, micro-batching and warm_start_all_tokens), each
rate of the grid takes `--steps` updates from a fresh copy of the weights and one fixed held-out batch is scored
before and after. Prints the table and the `trainer.warm_start_lr=... trainer.lr=...` to pass
(`trainer.warm_start_lr=auto` runs the same test at the start of a run's warm start); writes the measurements as
JSON. Exit status 1 when no rate qualifies, 2 on bad settings.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path

from agentrl.config import ConfigError, RunConfig, load_config
from agentrl.trainer.lr_range import (
    RL_FRACTION,
    RangeSpec,
    format_table,
    geometric_grid,
    no_rate_message,
    pick_rate,
    rl_rate,
    run_range,
)
from agentrl.types import Trajectory


async def expert_demos(cfg: RunConfig, model_dir: Path, per_task: int) -> list:
    """The scripted experts' episodes of up to `per_task` train samples of each task, as the rollout's expert
    plays them for the warm start (`agentrl.rollout.role.expert_demos`), with the tasks in this process."""
    import random

    from agentrl.evaluation.services import inprocess_client
    from agentrl.rollout.collect import Retry, collect
    from agentrl.rollout.engine import ExpertEngine, SamplingConfig
    from agentrl.rollout.from_config import chat_format
    from agentrl.rollout.spec import RolloutSpec

    spec = RolloutSpec.from_config(cfg)
    fmt = chat_format(cfg, model_dir)
    client = inprocess_client(cfg)
    rng = random.Random(spec.seed)
    reqs = []
    for task in spec.tasks:
        train = await client.indices(task, "train")
        reqs += [(task, i, f"expert-{task}-{i}") for i in rng.sample(train, min(per_task, len(train)))]
    sampling = SamplingConfig(spec.limits.max_new_tokens, cfg.rollout.temperature, cfg.rollout.top_p, fmt.stop_ids)
    trajs, _ = await collect(client, ExpertEngine(client), fmt, reqs, sampling, spec.limits, cfg.rollout.concurrency,
                             Retry(max_retries=spec.retry.max_retries))
    return trajs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", type=Path, nargs="?", help="default: the config's model.path")
    ap.add_argument("overrides", nargs="*", help="section.field=value, e.g. model.chat_template=chatml-tools")
    ap.add_argument("--preset", help="a preset name or YAML: its tasks, format and trainer settings")
    ap.add_argument("--tasks", help="comma-separated (default: the config's envs.tasks)")
    ap.add_argument("--demos", type=int, default=32, help="expert episodes per task (default 32)")
    ap.add_argument("--low", type=float, default=1e-6, help="the grid's lowest rate (default 1e-6)")
    ap.add_argument("--high", type=float, default=1e-2, help="the grid's highest rate (default 1e-2)")
    ap.add_argument("--points", type=int, default=9, help="rates on the grid, geometric (default 9: two a decade)")
    ap.add_argument("--rates", help="comma-separated rates instead of the grid")
    ap.add_argument("--steps", type=int, default=RangeSpec.steps, help=f"updates per rate (default {RangeSpec.steps})")
    ap.add_argument("--batch", type=int, default=RangeSpec.batch,
                    help=f"demonstrations per update (default {RangeSpec.batch})")
    ap.add_argument("--heldout", type=int, default=RangeSpec.heldout,
                    help=f"held-out demonstrations scored before and after (default {RangeSpec.heldout})")
    ap.add_argument("--full", action="store_true", help="measure the rates above the first that rises too")
    ap.add_argument("--threads", type=int, help="torch threads (default trainer.threads)")
    ap.add_argument("--json", type=Path, help="where to write the measurements (default RUN_ROOT/lr_range-MODEL.json)")
    args = ap.parse_intermixed_args(argv)
    if args.model_dir is not None and "=" in str(args.model_dir):  # only overrides were given
        args.overrides.insert(0, str(args.model_dir))
        args.model_dir = None
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        extra = [f"model.path={args.model_dir}"] if args.model_dir is not None else []
        extra += [f"envs.tasks=[{args.tasks}]"] if args.tasks else []
        cfg = load_config(args.preset, list(args.overrides) + extra, trains=False)  # it measures the rates
        if not cfg.model.path:
            raise ValueError("name a model directory (or model.path=DIR)")
        rates = (tuple(float(r) for r in args.rates.split(",") if r) if args.rates
                 else geometric_grid(args.low, args.high, args.points))
        if not rates or min(rates) <= 0 or min(args.steps, args.batch, args.heldout, args.demos) < 1:
            raise ValueError("rates must be positive; --steps, --batch, --heldout and --demos at least 1")
    except (ValueError, ConfigError) as e:
        print(f"jobs.lr_range: {e}", file=sys.stderr)
        return 2
    model_dir, t = Path(cfg.model.path), cfg.trainer
    spec = RangeSpec(rates, args.steps, args.batch, args.heldout, cfg.seed + t.seed, not args.full)
    t0 = time.monotonic()
    demos = asyncio.run(expert_demos(cfg, model_dir, args.demos))
    usable = warm_start_share(demos, cfg)
    print(f"model      {model_dir}\ndemos      {len(usable)} of {len(demos)} expert episodes of "
          f"{', '.join(cfg.envs.tasks)} ({'successful only' if t.warm_start_successful_only else 'all'}; "
          f"{time.monotonic() - t0:.0f} s)\nsettings   {spec.steps} steps of {spec.batch} demonstrations per rate, "
          f"{min(spec.heldout, len(usable) // 2)} held out; freeze_layers {t.freeze_layers}, micro_batch_tokens "
          f"{t.micro_batch_tokens}, warm_start_all_tokens {t.warm_start_all_tokens}", flush=True)
    if len(usable) < 2:
        print("jobs.lr_range: fewer than 2 demonstrations to train on (how they ended: python -m jobs.eval expert)",
              file=sys.stderr)
        return 1
    points = measure(model_dir, cfg, usable, spec, args.threads or t.threads)
    picked = pick_rate(points)
    print(format_table(points, picked))
    print(f"time       {time.monotonic() - t0:.0f} s")
    out = args.json or Path(cfg.run_root) / f"lr_range-{model_dir.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": str(model_dir), "preset": args.preset, "tasks": list(cfg.envs.tasks),
                               "spec": asdict(spec), "points": [{**asdict(p), "rises": p.rises, "drop": p.drop}
                                                                for p in points],
                               "sft_lr": picked, "lr": rl_rate(picked) if picked else None,
                               "rl_fraction": RL_FRACTION}, indent=2))
    print(f"json       {out}")
    if picked is None:
        print(no_rate_message(points, "jobs.lr_range").split(":\n")[0], file=sys.stderr)
        return 1
    if picked == max(spec.rates):  # nothing above it was tried: a higher rate might qualify too
        print(f"note       {picked:g} is the grid's highest rate: --high extends it", file=sys.stderr)
    print(f"trainer.warm_start_lr={picked:g} trainer.lr={rl_rate(picked):g}   (lr: {RL_FRACTION:.3g} x warm_start_lr)")
    return 0


def warm_start_share(demos: list[Trajectory], cfg: RunConfig) -> list[Trajectory]:
    """The demonstrations the warm start would train on (`warm_start.split_demos`: successful ones only unless
    `trainer.warm_start_successful_only` is off; the held-out `warm_start_target` ones left out)."""
    from agentrl.trainer.warm_start import split_demos

    return split_demos(demos, cfg.trainer, cfg.seed + cfg.trainer.seed)[0]


def measure(model_dir: Path, cfg: RunConfig, demos: list[Trajectory], spec: RangeSpec, threads: int) -> list:
    """The range test on the policy as the trainer loads it (one rank: frozen layers, attention, precision)."""
    import torch
    from transformers import AutoTokenizer

    from agentrl.trainer.model_load import load_policy
    from agentrl.trainer.parallel import Parallel

    t = cfg.trainer
    par = Parallel()
    torch.manual_seed(cfg.seed + t.seed)
    model = load_policy(model_dir, threads, par, t.activation_checkpointing, t.attn_implementation, t.freeze_layers)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    return run_range(model, demos, t, spec, pad_id, par,
                     on_point=lambda p: print(f"  {p.lr:9.3g}: held-out {p.before:.4f} -> {p.after:.4f}", flush=True))


if __name__ == "__main__":
    sys.exit(main())
