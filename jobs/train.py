"""The main job: the whole loop on one machine — controller, env workers, rollout (vLLM) and trainer as
processes — warm start, then RL, with held-out success reported before and after RL.

    python -m jobs.train --preset demo                         # the local demo (CPU, minutes)
    python -m jobs.train --preset demo trainer.steps=5 rollout.eval_samples=32
    python -m jobs.train --preset smoke --name mytest           # seconds-scale run used by the tests
    python -m jobs.train --preset smoke cluster.schedule=async cluster.rollout.ranks=2   # the asynchronous pipeline

Runs go to runs/<name>/ (config.yaml, rendezvous.json, logs/, tb/, shards/, weights/, report/). Under
Slurm the same role entry points run as srun steps of one heterogeneous job: `python -m jobs.launch
--preset P cluster.launcher=slurm` submits it through submitit, `--render-sbatch` prints it (docs/slurm.md).
"""
from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import time

from agentrl.config import ConfigError, dump_config, load_config
from agentrl.launch.local import PIPELINE, LocalLauncher, start_async_run, start_run
from agentrl.monitor.eval_summary import summary_lines


def echo(role: str, line: str) -> None:
    """Print agentrl's own progress lines from the role logs (not vLLM's start-up chatter)."""
    if " agentrl." in line and (" INFO " in line or " WARNING " in line or " ERROR " in line):
        msg = line.split(" agentrl.", 1)[1].split(" ", 2)[-1]
        print(f"[{role:>10}] {msg}", flush=True)
    elif "Traceback" in line or line.startswith(("Error", "RuntimeError")):
        print(f"[{role:>10}] {line}", flush=True)


def _stop_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="demo", help="a preset name (agentrl/presets) or a YAML path")
    ap.add_argument("--name", help="run name (default: the preset's)")
    ap.add_argument("overrides", nargs="*", help="section.field=value, e.g. trainer.lr=1e-5")
    args = ap.parse_args()
    overrides = list(args.overrides) + ([f"name={args.name}"] if args.name else [])
    try:
        cfg = load_config(args.preset, overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if cfg.cluster.launcher != "local":
        print(f"cluster.launcher={cfg.cluster.launcher}: jobs.train runs the roles on this machine; submit to "
              f"Slurm with `python -m jobs.launch --preset {args.preset} cluster.launcher=slurm`", file=sys.stderr)
        return 2

    run_dir = cfg.run_dir.resolve()
    if (run_dir / "config.yaml").exists():
        print(f"replacing the earlier run in {run_dir}")
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    dump_config(cfg, run_dir / "config.yaml")
    t0 = time.time()
    launcher = LocalLauncher(run_dir)
    # SIGTERM (Slurm's, a scheduler's, kill) and SIGINT end the run through `finally`: every role is stopped
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop_on_signal)
    timeout = cfg.cluster.role_timeout_s
    try:
        if cfg.cluster.schedule == "async":  # trainer + rollout ranks as one MPI world (docs/pipeline.md)
            start_async_run(launcher, cfg.envs.workers, not cfg.model.path, cfg.cluster.rollout.ranks,
                            cfg.cluster.engine_threads, echo=echo)
            ends = [PIPELINE]
        else:
            start_run(launcher, cfg.envs.workers, build_model=not cfg.model.path, echo=echo)
            ends = ["trainer", "rollout"]
        failed = launcher.watch(ends, timeout, echo, restartable=("env_worker-",),
                                max_restarts=cfg.cluster.max_restarts)
        if failed:
            print(launcher.failure_report(failed), file=sys.stderr)
            return 1
    finally:
        launcher.stop_all()

    summary = json.loads((run_dir / "report" / "summary.json").read_text())
    summary["wall_s"] = round(time.time() - t0, 1)
    (run_dir / "report" / "summary.json").write_text(json.dumps(summary, indent=2))
    sampled = ""
    if "sampled_success_before_rl" in summary:
        sampled = (f"; sampled at the rollout temperature {summary['sampled_success_before_rl']:.3f} -> "
                   f"{summary['sampled_success_after_rl']:.3f} ({summary['sampled_eval_episodes']} episodes/eval)")
    print(f"summary: held-out success (greedy) {summary['success_before_rl']:.3f} after warm start -> "
          f"{summary['success_after_rl']:.3f} after {summary['rl_steps']} RL steps "
          f"({summary['eval_episodes']} episodes/eval){sampled}; {summary['wall_s']:.0f}s, run dir {run_dir}")
    for line in summary_lines(summary):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
