"""Run the demo over seeds and trainer thread counts and check that RL's gain holds on every one.

    python -m jobs.demo_seeds                                   # seeds 0,1,2 x threads 1,2 (the README table)
    python -m jobs.demo_seeds --seeds 1 --threads 2 --min-gain 0.10 --min-sigmas 0     # what .ci/run checks
    python -m jobs.demo_seeds --seeds 0 --threads 2 --control   # also the control: warm start continued, no RL
    python -m jobs.demo_seeds --parallel 2                      # two runs at once (wall times then mean less)

Each run is `python -m jobs.train --preset demo seed=S trainer.threads=T` in its own run dir
(runs/demo-seeds/s<S>-t<T>/). The gate, per run and per task: the sampled held-out success after RL
exceeds the warm start's by at least --min-gain (absolute) and by more than --min-sigmas standard errors.
Prints a table and writes runs/bench/demo_seeds.json; exits 1 if any run or task misses the gate (a
control run is reported, never gated: it is there to show the gain is RL's).
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


def run_demo(root: Path, seed: int, threads: int, control: bool, extra: list[str]) -> dict[str, Any]:
    name = f"s{seed}-t{threads}" + ("-control" if control else "")
    cmd = [sys.executable, "-m", "jobs.train", "--preset", "demo", "--name", name, "--fresh", f"run_root={root}",
           f"seed={seed}", f"trainer.threads={threads}", *(["trainer.update=sft"] if control else []), *extra]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wall = time.time() - t0
    out: dict[str, Any] = {"name": name, "seed": seed, "threads": threads, "control": control, "wall_s": round(wall, 1),
                           "rc": proc.returncode}
    summary_path = root / name / "report" / "summary.json"
    if proc.returncode != 0 or not summary_path.exists():
        out["error"] = (proc.stdout[-1500:] + proc.stderr[-1500:]).strip()
        return out
    summary = json.loads(summary_path.read_text())
    out["rl_steps"] = summary.get("rl_steps")
    out["sft_steps"] = summary.get("trainer", {}).get("sft_steps")
    keys = ("success_before_rl", "success_after_rl", "sampled_success_before_rl", "sampled_success_after_rl",
            "sampled_gain", "sampled_gain_stderr")
    out["per_task"] = {task: {k: r.get(k) for k in keys} for task, r in summary["per_task"].items()}
    return out


def gate(run: dict[str, Any], min_gain: float, min_sigmas: float) -> list[str]:
    """Reasons this run misses the gate (empty: it passes)."""
    if "error" in run:
        return [f"{run['name']}: the run failed (rc {run['rc']})"]
    misses = []
    for task, r in run["per_task"].items():
        gain, se = r["sampled_gain"], r["sampled_gain_stderr"]
        if gain is None:
            misses.append(f"{run['name']} {task}: no sampled evaluation")
        elif gain < min_gain or gain <= min_sigmas * se:
            misses.append(f"{run['name']} {task}: sampled gain {gain:+.3f} (se {se:.3f}) misses "
                          f">= {min_gain} and > {min_sigmas} se")
    return misses


def table(runs: list[dict[str, Any]]) -> str:
    lines = [f"{'run':<16} {'task':<8} {'greedy':>15} {'sampled':>15} {'gain':>7} {'se':>6} {'sft':>5} {'wall':>6}"]
    for run in runs:
        if "error" in run:
            lines.append(f"{run['name']:<16} FAILED rc {run['rc']}")
            continue
        for task, r in run["per_task"].items():
            lines.append(f"{run['name']:<16} {task:<8} {r['success_before_rl']:>6.3f} -> {r['success_after_rl']:.3f} "
                         f"{r['sampled_success_before_rl']:>6.3f} -> {r['sampled_success_after_rl']:.3f} "
                         f"{r['sampled_gain']:>+7.3f} {r['sampled_gain_stderr']:>6.3f} {run['sft_steps']!s:>5} "
                         f"{run['wall_s']:>5.0f}s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--min-gain", type=float, default=0.15)
    ap.add_argument("--min-sigmas", type=float, default=3.0)
    ap.add_argument("--control", action="store_true",
                    help="also run the control (trainer.update=sft) on the first seed")
    ap.add_argument("--parallel", type=int, default=1, help="runs at once")
    ap.add_argument("--root", type=Path, default=Path("runs/demo-seeds"))
    ap.add_argument("--out", type=Path, default=Path("runs/bench/demo_seeds.json"))
    ap.add_argument("overrides", nargs="*", help="extra section.field=value for every run")
    args = ap.parse_args(argv)
    combos = [(int(s), int(t), False) for s in args.seeds.split(",") for t in args.threads.split(",")]
    if args.control:
        combos.append((combos[0][0], combos[0][1], True))
    root = args.root.resolve()
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        runs = list(pool.map(lambda c: run_demo(root, *c, args.overrides), combos))
    print(table(runs))
    misses = [m for run in runs if not run["control"] for m in gate(run, args.min_gain, args.min_sigmas)]
    for m in misses:
        print("MISS", m)
    for run in runs:
        if "error" in run:
            print(f"--- {run['name']} output:\n{run['error']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"min_gain": args.min_gain, "min_sigmas": args.min_sigmas, "runs": runs,
                                    "misses": misses}, indent=2))
    gated = sum(len(run.get("per_task", {})) or 1 for run in runs if not run["control"])
    print(f"wrote {args.out}")
    print(f"demo: {gated - len(misses)} passed, {len(misses)} failed")  # one line per (run, task) gate
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
