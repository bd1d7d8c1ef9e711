"""The main job: the whole loop on one machine — controller, env workers, rollout (vLLM) and trainer as
processes — warm start, then RL, with held-out success reported before and after RL.

    python -m jobs.train --preset demo                         # the local demo (CPU, minutes)
    python -m jobs.train --preset demo trainer.steps=5 rollout.eval_samples=32
    python -m jobs.train --preset smoke --name mytest           # seconds-scale run used by the tests
    python -m jobs.train --preset smoke cluster.schedule=async cluster.rollout.ranks=2   # smoke, asynchronous

Runs go to runs/<name>/ (config.yaml, rendezvous.json, logs/, tb/, shards/, weights/, report/). Running
the same command again on an unfinished run continues it (from the trainer's newest checkpoint, the rollout
shards drained first); on a finished one it prints the summary; --fresh replaces it. A pipeline that dies
mid-run (a killed rank ends the MPI world) is started again, resuming the same way, up to
cluster.max_restarts times; with transport.channel=files (no MPI) the trainer and each rollout rank are
roles of their own, and a dead one is restarted alone while the others go on (rollout ranks follow a
restarted trainer by restarting themselves). Both schedules run this way (sync is the pipeline with
max_staleness 0 and one step's groups per step). Under
Slurm the same role entry points run as srun steps of one heterogeneous job: `python -m jobs.launch
--preset P cluster.launcher=slurm` submits it through submitit, `--render-sbatch` prints it (docs/slurm.md).
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import signal
import sys
import time
from pathlib import Path

from agentrl.config import ConfigError, dump_config, load_config
from agentrl.fsio import write_json_atomic
from agentrl.launch import rendezvous
from agentrl.launch.continuing import resume_check
from agentrl.launch.fork import fork_warm_start
from agentrl.launch.local import (
    PIPELINE,
    PIPELINE_KEYS,
    ROLLOUT_PREFIX,
    TRAINER,
    LocalLauncher,
    start_pipeline,
)
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
    ap.add_argument("--fresh", action="store_true", help="replace an existing run of the same name")
    ap.add_argument("overrides", nargs="*", help="section.field=value, e.g. trainer.lr=1e-5")
    args = ap.parse_args()
    overrides = list(args.overrides) + ([f"name={args.name}"] if args.name else [])
    try:
        cfg = load_config(args.preset, overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if cfg.model.path:  # a model brought as it is: its format and prompt lengths checked before any process starts
        from agentrl.rollout.model_check import preflight

        try:
            preflight(cfg)
        except (ValueError, OSError) as e:
            print(f"config error: {e}", file=sys.stderr)
            return 2
    if cfg.cluster.launcher != "local":
        print(f"cluster.launcher={cfg.cluster.launcher}: jobs.train runs the roles on this machine; submit to "
              f"Slurm with `python -m jobs.launch --preset {args.preset} cluster.launcher=slurm`", file=sys.stderr)
        return 2

    if cfg.transport.channel == "files" and cfg.cluster.trainer.world_size > 1:
        print(f"config error: cluster.trainer.ranks_per_node: this launcher starts one file-channel trainer process, "
              f"not {cfg.cluster.trainer.world_size}; use transport.channel=mpi (one MPI world of every rank)",
              file=sys.stderr)
        return 2
    run_dir = cfg.run_dir.resolve()
    resuming = (run_dir / "config.yaml").exists() and not args.fresh
    if resuming:
        finished = run_dir / "report" / "summary.json"
        if finished.exists():
            summary = json.loads(finished.read_text())
            print(f"the run in {run_dir} is finished (--fresh starts it again):")
            _print_summary(summary, run_dir)
            return 0
        why = resume_check(run_dir, cfg)
        if why:
            print(f"cannot continue the run in {run_dir}: {why}. Rerun with the options it was started "
                  f"with, or pass --fresh to replace it.", file=sys.stderr)
            return 2
        print(f"continuing the run in {run_dir}")
        (run_dir / rendezvous.FILENAME).unlink(missing_ok=True)  # every role starts again: no stale address
    elif (run_dir / "config.yaml").exists():
        print(f"replacing the earlier run in {run_dir}")
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.trainer.warm_start_from and not resuming:
        try:
            print(fork_warm_start(cfg, run_dir))
        except ValueError as e:  # checked before anything is copied
            print(f"config error: {e}", file=sys.stderr)
            return 2
    dump_config(cfg, run_dir / "config.yaml")
    build_model = not cfg.model.path and not (run_dir / "model" / "config.json").exists()
    t0 = time.time()
    launcher = LocalLauncher(run_dir)
    # SIGTERM (Slurm's, a scheduler's, kill) and SIGINT end the run through `finally`: every role is stopped
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop_on_signal)
    timeout = cfg.cluster.time_limit_s or math.inf  # the run's wall time; each role bounds its own waits
    try:
        # one MPI world, or (files) separate roles (docs/pipeline.md); the synchronous baseline alike
        ends = start_pipeline(launcher, cfg.envs.workers, build_model, cfg.cluster.rollout.ranks,
                              cfg.cluster.engine_threads, echo=echo, channel=cfg.transport.channel,
                              trainer_ranks=cfg.cluster.trainer.world_size)
        restartable = ("env_worker-", PIPELINE) if cfg.transport.channel == "mpi" else \
            ("env_worker-", TRAINER, ROLLOUT_PREFIX)  # files: each alone, the others go on

        def before_restart(name: str) -> None:
            if name in (PIPELINE, TRAINER):  # its trainer's addresses die with it; the new one publishes its own
                rendezvous.remove(run_dir, *PIPELINE_KEYS)

        failed = launcher.watch(ends, timeout, echo, restartable=restartable, max_restarts=cfg.cluster.max_restarts,
                                before_restart=before_restart)
        if failed:
            print(launcher.failure_report(failed), file=sys.stderr)
            return 1
    finally:
        launcher.stop_all()

    summary = json.loads((run_dir / "report" / "summary.json").read_text())
    summary["wall_s"] = round(time.time() - t0, 1)
    summary["continued"] = resuming
    summary["pipeline_restarts"] = launcher.roles[PIPELINE].restarts if PIPELINE in launcher.roles else 0
    if cfg.transport.channel == "files":
        summary["role_restarts"] = {n: r.restarts for n, r in launcher.roles.items()
                                    if n == TRAINER or n.startswith(ROLLOUT_PREFIX)}
    write_json_atomic(run_dir / "report" / "summary.json", summary, indent=2)
    _print_summary(summary, run_dir)
    return 0


def _print_summary(summary: dict, run_dir: Path) -> None:
    sampled = ""
    if "sampled_success_before_rl" in summary:
        sampled = (f"; sampled at the rollout temperature {summary['sampled_success_before_rl']:.3f} -> "
                   f"{summary['sampled_success_after_rl']:.3f} ({summary['sampled_eval_episodes']} episodes/eval)")
    print(f"summary: held-out success (greedy) {summary['success_before_rl']:.3f} after warm start -> "
          f"{summary['success_after_rl']:.3f} after {summary['rl_steps']} RL steps "
          f"({summary['eval_episodes']} episodes/eval){sampled}; {summary.get('wall_s', 0):.0f}s, run dir {run_dir}")
    for line in summary_lines(summary):
        print(line)


if __name__ == "__main__":
    sys.exit(main())
