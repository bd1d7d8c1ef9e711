r"""The pipeline planner (docs/planner.md): a discrete-event model of rollout ranks, engines, env calls and the
trainer, calibrated from a run directory or fed with a cluster's rates. Pure Python, seconds on a laptop.

    python -m jobs.plan_pipeline --calibrate runs/bench/sync                 # fitted rates, model vs the run
    python -m jobs.plan_pipeline --check-bench runs/bench                    # both schedules vs bench_pipeline
    python -m jobs.plan_pipeline --predict runs/bench/async-s4-r1 \
        --fit runs/bench/async runs/bench/async-s8-r1                         # out of sample: engine curve from two
    python -m jobs.plan_pipeline --preset agentbench-qwen2.5-14b \
        --engine-tokens-per-s 2500 --trainer-tokens-per-s-per-gpu 4000 --env-median-s 1.0 --totals 16,32,64
    python -m jobs.plan_pipeline --memory                                     # every preset's trainer per rank
    python -m jobs.plan_pipeline --memory agentbench-qwen2.5-7b --gpu-gib 40 --set trainer.micro_batch_tokens=32768

No Slurm and no GPU: run it anywhere the package imports (a login node will do).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, replace
from pathlib import Path

from agentrl.bench.planner import simulate, simulate_mean, with_schedule
from agentrl.bench.planner_calibrate import calibrate, check_bench, measured_throughput
from agentrl.bench.planner_curve import predict_run
from agentrl.bench.planner_project import ClusterRates, best_split, default_workload, preset_gpus, project
from agentrl.config import load_config


def _curve(text: str) -> tuple[tuple[int, float], ...]:
    """"1:1,16:4,64:6" -> ((1, 1.0), (16, 4.0), (64, 6.0))."""
    if not text:
        return ((1, 1.0),)
    return tuple(sorted((int(a), float(b)) for a, b in (p.split(":") for p in text.split(","))))


def _engine_curve(args: argparse.Namespace) -> tuple[tuple[int, float], ...]:
    """--engine-curve as given, or the one --seq-tokens-per-s implies: each sequence decodes at most that fast,
    so the engine's throughput grows with its batch until it reaches --engine-tokens-per-s."""
    if args.engine_curve or not args.seq_tokens_per_s:
        return _curve(args.engine_curve)
    n_sat = max(math.ceil(args.engine_tokens_per_s / args.seq_tokens_per_s), 2)
    return ((1, args.seq_tokens_per_s / args.engine_tokens_per_s), (n_sat, 1.0))


def _calibrate(args: argparse.Namespace) -> dict:
    c = calibrate(args.calibrate, swap_s=args.swap_s, skip_first_window=args.skip_first_window)
    res = simulate(c["layout"], c["rates"], c["work"], args.seed)
    other = with_schedule(c["layout"], "async" if c["schedule"] == "sync" else "sync", max_staleness=1)
    seen = measured_throughput(args.calibrate)
    return {"schedule": c["schedule"], "layout": asdict(c["layout"]), "rates": asdict(c["rates"]),
            "work": asdict(c["work"]), "measured": asdict(c["measured"]),
            "run_traj_per_s": None if seen is None else {"steady": round(seen[0], 3), "e2e": round(seen[1], 3)},
            "model": res.summary(), "model_median_of_5_draws": simulate_mean(c["layout"], c["rates"], c["work"],
                                                                             range(5)),
            "model_other_schedule_same_rates": simulate_mean(other, c["rates"], c["work"])}


def _project(args: argparse.Namespace) -> dict:
    cfg = load_config(args.preset, args.set)
    cr = ClusterRates(args.engine_tokens_per_s, args.trainer_tokens_per_s_per_gpu, args.env_median_s, args.env_sigma,
                      args.step_fixed_s, args.publish_s, args.swap_s if args.swap_s is not None else 2.0,
                      _engine_curve(args))
    if args.env_samples:
        cr = replace(cr, env_samples=tuple(float(x) for x in args.env_samples.read_text().split()))
    work = default_workload(cfg, args.turns, args.gen_tokens, args.obs_tokens, args.prompt_tokens)
    t_gpus, r_gpus = preset_gpus(cfg)
    seeds = tuple(range(args.seeds))
    out = {"preset": args.preset, "rates": asdict(cr), "work": asdict(work),
           "preset_split": project(cfg, cr, work, t_gpus, r_gpus, args.steps, seeds), "sweeps": []}
    for total in (int(x) for x in args.totals.split(",") if x):
        sweep = best_split(cfg, cr, work, total, args.steps, args.granularity, seeds)
        out["sweeps"].append(sweep)
    return out


def _print_projection(out: dict) -> None:
    p = out["preset_split"]
    print(f"{out['preset']}: {p['trainer_gpus']} trainer + {p['rollout_gpus']} rollout GPUs "
          f"({p['ranks']} ranks, {p['engines']} engines)")
    for name in ("sync", "async"):
        s = p[name]
        print(f"  {name:5s} {s['steady_traj_per_s']:8.2f} traj/s steady, {s['e2e_traj_per_s']:8.2f} end to end; "
              f"trainer idle {s['trainer_idle_frac']:.2f}, rollout idle {s['rollout_idle_frac']:.2f}, "
              f"staleness mean {s['staleness_mean']:.2f} max {s['staleness_max']}")
    print(f"  async/sync {p['async_over_sync']:.2f}")
    tok = out["work"]["turns"] * out["work"]["gen_tokens"]
    for sw in out["sweeps"]:
        print(f"{sw['total_gpus']} GPUs, trainer:rollout split")
        for r in sw["rows"]:
            print(f"  {r['trainer_gpus']:3d}:{r['rollout_gpus']:<3d} sync {r['sync']['steady_traj_per_s']:8.2f} "
                  f"async {r['async']['steady_traj_per_s']:8.2f} traj/s "
                  f"(async trainer idle {r['async']['trainer_idle_frac']:.2f}, "
                  f"rollout idle {r['async']['rollout_idle_frac']:.2f})")
        b = sw["best"]
        print(f"  best sync {b['sync']['trainer_gpus']}:{b['sync']['rollout_gpus']} {b['sync']['traj_per_s']:.2f} "
              f"traj/s ({b['sync']['traj_per_s'] * tok:,.0f} generated tokens/s); best async "
              f"{b['async']['trainer_gpus']}:{b['async']['rollout_gpus']} {b['async']['traj_per_s']:.2f} traj/s "
              f"({b['async']['traj_per_s'] * tok:,.0f} tokens/s); ratio {sw['best_async_over_best_sync']:.2f}")


MEMORY_PRESETS = ("agentbench-qwen2.5-3b", "agentbench-qwen2.5-7b", "agentbench-qwen2.5-14b", "agentbench-qwen2.5-32b")


def _memory(args: argparse.Namespace) -> list[dict]:
    """The trainer's memory model (`agentrl.trainer.memory`) per rank for each preset, with --set applied."""
    from agentrl.trainer.memory import SHAPES, Shape, preset_setup, report

    rows = []
    for name in args.memory or MEMORY_PRESETS:
        cfg = load_config(name, args.set)
        size = args.shape or name.rsplit("-", 1)[-1]
        if size not in SHAPES and not Path(size).exists():
            raise SystemExit(f"{name}: no shape named {size!r} (one of {sorted(SHAPES)}, or --shape config.json)")
        shape = SHAPES[size] if size in SHAPES else Shape.from_config(size)
        setup, gpu = preset_setup(cfg, args.gpu_gib)
        rows.append(report(name, shape, setup, gpu))
    return rows


def _print_memory(rows: list[dict]) -> None:
    order = ("params", "grads", "optimizer", "gathered", "activations", "attention_mask", "head", "reference")
    keys = [k for k in order if any(k in r["gib"] for r in rows)]
    print("GiB per trainer rank (agentrl.trainer.memory; peak = the sum; fits: peak <= 85% of the GPU)")
    print(f"{'preset':24s} {'ranks':>5s} {'mbt':>6s} {'ckpt':>4s} " + " ".join(f"{k[:10]:>10s}" for k in keys)
          + f" {'peak':>7s} {'old head':>8s} {'gpu':>5s} fits")
    for r in rows:
        u, g = r["setup"], r["gib"]
        ckpt = "on" if u["checkpointing"] else "off"
        print(f"{r['name']:24s} {u['ranks']:5d} {u['micro_batch_tokens']:6d} {ckpt:>4s} "
              + " ".join(f"{g.get(k, 0.0):10.2f}" for k in keys)
              + f" {g['peak']:7.1f} {r['peak_old_head_gib']:8.1f} {r['gpu_gib']:5.0f} {'yes' if r['fits'] else 'NO'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--calibrate", help="a run directory: fit the rates to its metrics, model it")
    mode.add_argument("--check-bench", help="jobs.bench_pipeline's root (runs/bench): predict both schedules")
    mode.add_argument("--preset", help="project this preset's layout with the rates below")
    mode.add_argument("--memory", nargs="*", metavar="PRESET",
                      help="the trainer's memory per rank for these presets (default: every agentbench-qwen2.5-*)")
    mode.add_argument("--predict", type=Path,
                      help="a run directory to predict from its config alone, with rates fitted on --fit's runs")
    ap.add_argument("--fit", type=Path, nargs="+", default=[],
                    help="--predict: two or more run dirs at different loads (e.g. max_staleness 1 and 8) to fit "
                         "the engine curve, trainer and workload on")
    ap.add_argument("--sweep-staleness", default="",
                    help="--predict: also model the target's layout at these max_staleness bounds (e.g. 1,2,4,8,16) "
                         "and name the smallest within 5%% of the best throughput")
    ap.add_argument("--engine-tokens-per-s", type=float, default=2000.0, help="one engine's generated tokens/s")
    ap.add_argument("--engine-curve", default="",
                    help="relative engine throughput by requests in flight, e.g. 1:0.05,64:0.6,256:1 (default flat)")
    ap.add_argument("--seq-tokens-per-s", type=float, default=0.0,
                    help="one sequence's decode speed cap (makes the engine curve: n x this up to the engine's rate)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="config overrides of the preset, e.g. 'envs.tasks=[webshop]' rollout.groups_per_task=64")
    ap.add_argument("--trainer-tokens-per-s-per-gpu", type=float, default=3000.0,
                    help="trained tokens/s of one trainer GPU (forward+backward, all tokens of a trajectory)")
    ap.add_argument("--step-fixed-s", type=float, default=0.0, help="a trainer step's fixed cost, seconds")
    ap.add_argument("--env-median-s", type=float, default=1.0, help="median env latency per env call")
    ap.add_argument("--env-sigma", type=float, default=0.99, help="its lognormal sigma (0.99: p99 = 10x median)")
    ap.add_argument("--env-samples", type=Path, default=None,
                    help="a file of measured env latencies (seconds, one per line), drawn instead of the lognormal")
    ap.add_argument("--publish-s", type=float, default=2.0, help="step end to weights visible to the rollout")
    ap.add_argument("--swap-s", type=float, default=None,
                    help="engine pause to load weights (projection default 2; --calibrate: fitted on a sync run)")
    ap.add_argument("--turns", type=float, default=None, help="mean turns per episode (default: half the cap)")
    ap.add_argument("--gen-tokens", type=float, default=150.0, help="tokens generated per turn")
    ap.add_argument("--obs-tokens", type=float, default=150.0, help="observation tokens per turn")
    ap.add_argument("--prompt-tokens", type=float, default=1000.0, help="first prompt's tokens")
    ap.add_argument("--totals", default="16,32,64", help="total GPUs to sweep the trainer:rollout split over")
    ap.add_argument("--granularity", type=int, default=8, help="split step, GPUs (a node)")
    ap.add_argument("--steps", type=int, default=6, help="modelled steps per projection")
    ap.add_argument("--seeds", type=int, default=1, help="env-latency draws per projection (median taken)")
    ap.add_argument("--skip-first-window", action="store_true",
                    help="calibration: fit the engine to the rank's busy rate from its first weight swap on")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gpu-gib", type=float, default=80.0, help="--memory: each trainer GPU's memory")
    ap.add_argument("--shape", default="", help="--memory: 0.5b|1.5b|3b|7b|14b|32b or a config.json (default: "
                                                 "from the preset's name)")
    ap.add_argument("--json", action="store_true", help="print the whole result as JSON")
    args = ap.parse_args(argv)
    if args.memory is not None:
        rows = _memory(args)
        print(json.dumps(rows, indent=2)) if args.json else _print_memory(rows)
        return 0
    if args.calibrate:
        out = _calibrate(args)
        print(json.dumps(out, indent=2, default=str))
        return 0
    if args.predict:
        if len(args.fit) < 2:
            ap.error("--predict needs --fit with two or more run directories at different loads")
        swap_s, sync = args.swap_s, args.predict.parent / "sync"
        if swap_s is None:  # the hand-off as check-bench takes it: fitted on the bench's sync run, if there is one
            swap_s = calibrate(sync)["rates"].swap_s if (sync / "report" / "trainer.json").exists() else 0.0
        bench = args.predict.parent / "pipeline.json"
        try:
            sweep = tuple(int(x) for x in args.sweep_staleness.split(",") if x)
            if any(b < 0 for b in sweep):
                raise ValueError(f"--sweep-staleness {args.sweep_staleness!r}: bounds are >= 0")
            out = predict_run(args.fit, args.predict, bench if bench.exists() else None, swap_s=swap_s, sweep=sweep)
        except ValueError as e:
            ap.error(str(e))
        print(json.dumps(out, indent=2))
        print(f"{out['target']} (max_staleness {out['target_max_staleness']}): predicted "
              f"{out['predicted']['steady_traj_per_s']:.3f} steady traj/s, measured "
              f"{out['measured']['steady_traj_per_s']:.3f}"
              f" ({out['error']['steady_traj_per_s']:+.1%}; flat engine from the first run alone "
              f"{out['flat_first_run']['error']:+.1%}); end to end {out['error']['e2e_traj_per_s']:+.1%}")
        if "staleness_sweep" in out:
            sw = out["staleness_sweep"]
            for r in sw["rows"]:
                print(f"  max_staleness {r['max_staleness']:3d}: {r['steady_traj_per_s']:7.3f} steady traj/s, "
                      f"{r['e2e_traj_per_s']:7.3f} end to end, trainer idle {r['trainer_idle_frac']:.2f}, "
                      f"staleness mean {r['staleness_mean']:.2f}")
            print(f"  recommended algo.max_staleness={sw['recommended_max_staleness']} (the smallest within "
                  f"{sw['within']:.0%} of the best steady throughput)")
        return 0
    if args.check_bench:
        out = check_bench(args.check_bench, skip_first_window=args.skip_first_window)
        print(json.dumps(out, indent=2))
        worst = max(abs(out[s]["error"]["steady"]) for s in ("sync", "async"))
        print(f"worst steady-state error {worst:.1%} (goal: within 15%)")
        return 0
    out = _project(args)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        _print_projection(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
