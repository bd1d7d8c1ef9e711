r"""Run the demo (or another preset) over seeds and trainer thread counts and check that RL's gain holds on every one.

    python -m jobs.demo_seeds                                   # seeds 0,1,2 x threads 1,2 (the README table)
    python -m jobs.demo_seeds --seeds 1 --threads 2 --min-gain 0.10 --min-sigmas 0     # what .ci/run checks
    python -m jobs.demo_seeds --seeds 0 --threads 2 --control   # also the control: warm start continued, no RL
    python -m jobs.demo_seeds --parallel 2                      # two runs at once (wall times then mean less)
    python -m jobs.demo_seeds --preset smollm2-135m --seeds 0,1 --threads 2 --control all --gate-control \
        --min-gain 0 --root runs/smollm2-seeds --out runs/bench/smollm2_seeds.json      # the real model (README)
    python -m jobs.demo_seeds ... --reuse     # the same sweep again: finished runs are read, unfinished continued
    python -m jobs.demo_seeds --preset smollm2-135m-agentbench --seeds 0,1 --threads 2 --control all \
        --gate-mean 3 --max-drop-sigmas 2 --root runs/smollm2-agentbench-seeds \
        --ablate algo.task_norm=false --out runs/bench/smollm2_agentbench_seeds.json --reuse  # the paper's tasks

Each run is `python -m jobs.train --preset P seed=S trainer.threads=T` in its own run dir
(runs/demo-seeds/s<S>-t<T>/). The gate, per run and per task: the sampled held-out success after RL
exceeds the warm start's by at least --min-gain (absolute) and by more than --min-sigmas standard errors.
Prints a table and writes runs/bench/demo_seeds.json; exits 1 if any run or task misses the gate. A control
run (`trainer.update=warm_start`: the same warm start as the RL run, continued for as many updates, no RL, each
of `trainer.control_batch` demonstrations, its rollout playing no training episode; --control for the first seed,
--control all for each; it starts from the RL run's own warm start and evaluation before RL,
`trainer.warm_start_from`, unless --own-warm-start) is reported;
with --gate-control each run's sampled success after RL must also exceed its seed's control's by more than
--min-sigmas standard errors (binomial, over both evaluations' episodes). --ablate adds, on the first seed, the RL run
again with other settings (the paper's ablation: algo.task_norm=false), from the same warm start, reported as
RL - ablation per task and on the mean, not gated. With several tasks, --gate-mean K gates
the mean over tasks of RL - control instead (more than K standard errors, the tasks' pooled) and drops the per-task
gain gate; --max-drop-sigmas K fails a task whose sampled success after RL is more than K standard errors below its
warm start's.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agentrl.bench.seeds import drop_gate, gate, mean_gate, mean_versus_control, table, versus_control
from agentrl.run_files import CKPT_DIR, WARM_FILE


def run_name(seed: int, threads: int, kind: str | bool) -> str:
    kind = {True: "control", False: "rl"}.get(kind, kind) if isinstance(kind, bool) else kind
    return f"s{seed}-t{threads}" + ("" if kind == "rl" else f"-{kind}")


def read_run(root: Path, seed: int, threads: int, kind: str | bool) -> dict[str, Any] | None:
    """A finished run's row from its report/summary.json (None: the run has no summary)."""
    name = run_name(seed, threads, kind)
    path = root / name / "report" / "summary.json"
    if not path.exists():
        return None
    summary = json.loads(path.read_text())
    keys = ("success_before_rl", "success_after_rl", "sampled_success_before_rl", "sampled_success_after_rl",
            "sampled_gain", "sampled_gain_stderr", "sampled_episodes")
    return {"name": name, "seed": seed, "threads": threads, "control": name.endswith("-control"),
            "ablation": name.endswith("-ablate"), "rc": 0,
            "wall_s": round(float(summary.get("wall_s", 0.0)), 1), "rl_steps": summary.get("rl_steps"),
            "sft_steps": summary.get("trainer", {}).get("sft_steps"),
            "per_task": {task: {k: r.get(k) for k in keys} for task, r in summary["per_task"].items()}}


def run_demo(root: Path, seed: int, threads: int, kind: str | bool, extra: list[str], preset: str = "demo",
             kind_extra: tuple[str, ...] = (), reuse: bool = False, share_warm_start: bool = True) -> dict[str, Any]:
    """One `jobs.train` run in root/<name> (--fresh), or with `reuse` the summary a finished one left there (an
    unfinished one is continued). `kind`: rl, control (`trainer.update=warm_start` and `kind_extra`) or ablate (the RL
    run with `kind_extra`). A control or an ablation starts from its seed's RL run's warm start and evaluation
    before RL when that run has them (`share_warm_start`: `trainer.warm_start_from`)."""
    kind = {True: "control", False: "rl"}.get(kind, kind) if isinstance(kind, bool) else kind
    name = run_name(seed, threads, kind)
    if reuse and (done := read_run(root, seed, threads, kind)) is not None:
        print(f"{name}: reusing its finished run in {root / name}", flush=True)
        return done | {"reused": True}
    # --reuse goes on with a run stopped half-way (jobs.train continues it, or refuses a changed config)
    fresh = [] if reuse and (root / name / "config.yaml").exists() else ["--fresh"]
    if not fresh:
        print(f"{name}: continuing the unfinished run in {root / name}", flush=True)
    cmd = [sys.executable, "-m", "jobs.train", "--preset", preset, "--name", name, *fresh, f"run_root={root}",
           f"seed={seed}", f"trainer.threads={threads}", *extra,
           *(["trainer.update=warm_start"] if kind == "control" else []), *(kind_extra if kind != "rl" else ())]
    source = root / run_name(seed, threads, "rl")
    if kind != "rl" and share_warm_start and (source / CKPT_DIR / "step-0" / WARM_FILE).is_file():
        cmd.append(f"trainer.warm_start_from={source}")  # the RL run's warm start and evaluation before RL
        print(f"{name}: starting from the warm start of {source}", flush=True)
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wall = time.time() - t0
    out = read_run(root, seed, threads, kind) if proc.returncode == 0 else None
    if out is None:
        return {"name": name, "seed": seed, "threads": threads, "control": kind == "control",
                "ablation": kind == "ablate", "wall_s": round(wall, 1), "rc": proc.returncode,
                "error": (proc.stdout[-1500:] + proc.stderr[-1500:]).strip()}
    return out | {"wall_s": round(wall, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--min-gain", type=float, default=0.15)
    ap.add_argument("--min-sigmas", type=float, default=3.0)
    ap.add_argument("--control", nargs="?", const="first", choices=("first", "all"),
                    help="also run the control (trainer.update=warm_start): on the first seed, or on each (all)")
    ap.add_argument("--gate-control", action="store_true",
                    help="gate each run's sampled success after RL on its seed's control's, too")
    ap.add_argument("--gate-mean", type=float, default=None, metavar="K",
                    help="with a control: gate on the mean over tasks of RL - control exceeding K standard errors "
                         "(the multi-task bar), instead of each task's against --min-sigmas")
    ap.add_argument("--max-drop-sigmas", type=float, default=None, metavar="K",
                    help="also gate: no task's sampled success after RL below its warm start's by more than K "
                         "standard errors (training the tasks together costs none of them)")
    ap.add_argument("--ablate", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                    help="on the first seed, one more RL run with these settings (e.g. algo.task_norm=false), from "
                         "that seed's warm start, reported against its RL run (not gated); repeatable")
    ap.add_argument("--control-set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                    help="a setting for the control runs only (e.g. trainer.control_batch=32: as many "
                         "demonstrations per update as an RL step's episodes); repeatable")
    ap.add_argument("--preset", default="demo", help="the preset every run trains (default: demo)")
    ap.add_argument("--reuse", action="store_true",
                    help="a run whose run dir already holds a finished summary is read, not run again, and an "
                         "unfinished one is continued from its checkpoint (a sweep stopped half-way goes on where "
                         "it stopped)")
    ap.add_argument("--parallel", type=int, default=1, help="runs at once")
    ap.add_argument("--own-warm-start", action="store_true",
                    help="each control run makes its own warm start and evaluation before RL, instead of starting "
                         "from its seed's RL run's (trainer.warm_start_from; the same numbers, an hour less a seed "
                         "on the multi-task preset)")
    ap.add_argument("--root", type=Path, default=Path("runs/demo-seeds"))
    ap.add_argument("--out", type=Path, default=Path("runs/bench/demo_seeds.json"))
    ap.add_argument("overrides", nargs="*", help="extra section.field=value for every run")
    args = ap.parse_args(argv)
    combos = [(int(s), int(t), "rl") for s in args.seeds.split(",") for t in args.threads.split(",")]
    if args.control == "first":
        combos.append((combos[0][0], combos[0][1], "control"))
    elif args.control == "all":  # interleaved: each seed's RL run, then its control
        combos = [c for rl in combos for c in (rl, (rl[0], rl[1], "control"))]
    if args.ablate:  # after the first seed's RL run (and its control), from its warm start
        at = max(i for i, c in enumerate(combos) if c[:2] == combos[0][:2]) + 1
        combos.insert(at, (combos[0][0], combos[0][1], "ablate"))
    root = args.root.resolve()
    extras = {"rl": (), "control": tuple(args.control_set), "ablate": tuple(args.ablate)}
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        runs = list(pool.map(lambda c: run_demo(root, *c, args.overrides, args.preset, extras[c[2]], args.reuse,
                                                 not args.own_warm_start), combos))
    ablations = [run for run in runs if run.get("ablation")]
    runs = [run for run in runs if not run.get("ablation")]  # the gates below see RL runs and controls only
    if args.gate_mean is None:
        misses = [m for run in runs if not run["control"] for m in gate(run, args.min_gain, args.min_sigmas)]
    else:  # the multi-task bar: the mean against the control and the drop gate stand for each task's own gain
        misses = [f"{run['name']}: the run failed (rc {run['rc']})" for run in runs if "error" in run]
    if args.max_drop_sigmas is not None:
        misses += [m for run in runs if not run["control"] for m in drop_gate(run, args.max_drop_sigmas)]
    controls = {(run["seed"], run["threads"]): run for run in runs if run["control"]}
    for run in runs:
        control = controls.get((run["seed"], run["threads"]))
        if not run["control"] and control is not None:
            run["vs_control"], missed = versus_control(run, control, args.min_sigmas)
            run["vs_control_mean"] = mean_versus_control(run["vs_control"])
            if args.gate_mean is not None:
                misses += mean_gate(run, args.gate_mean)
            elif args.gate_control:
                misses += missed
    print(table(runs))
    for run in runs:
        if (m := run.get("vs_control_mean")) is not None:
            print(f"{run['name']}: mean over {m['tasks']} tasks, RL - control {m['diff']:+.3f} ± {m['se']:.3f} "
                  f"({m['diff'] / m['se'] if m['se'] else float('inf'):.1f} se)")
    for ab in ablations:  # reported beside its RL run, not gated
        rl = next((r for r in runs if not r["control"] and (r["seed"], r["threads"]) == (ab["seed"], ab["threads"])),
                  None)
        print(table([ab]))
        if rl is not None:
            ab["vs_rl"], _ = versus_control(rl, ab, 0.0)
            if (m := mean_versus_control(ab["vs_rl"])) is not None:
                ab["vs_rl_mean"] = m
                print(f"{ab['name']} ({' '.join(args.ablate)}): mean over {m['tasks']} tasks, RL - ablation "
                      f"{m['diff']:+.3f} ± {m['se']:.3f} ({m['diff'] / m['se'] if m['se'] else float('inf'):.1f} se)")
    for m in misses:
        print("MISS", m)
    for run in runs + ablations:
        if "error" in run:
            print(f"--- {run['name']} output:\n{run['error']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"min_gain": args.min_gain, "min_sigmas": args.min_sigmas, "runs": runs,
                                    "ablations": ablations, "ablate": args.ablate, "misses": misses}, indent=2))
    gated = 0  # one per (run, task) gate, one per run for the mean gate
    for run in runs:
        if run["control"]:
            continue
        tasks = len(run.get("per_task", {})) or 1
        gated += tasks * ((args.gate_mean is None) + (args.max_drop_sigmas is not None))
        if "vs_control" in run:
            gated += 1 if args.gate_mean is not None else tasks if args.gate_control else 0
    print(f"wrote {args.out}")
    print(f"{args.preset}: {gated - len(misses)} passed, {len(misses)} failed")  # one line per (run, task) gate
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
