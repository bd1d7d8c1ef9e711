"""Launch a run where `cluster.launcher` says: on this machine, or as one Slurm job through submitit.

    python -m jobs.launch --preset smoke                                   # local: the same as jobs.train
    python -m jobs.launch --preset agentbench-qwen2.5-7b cluster.launcher=slurm   # one heterogeneous job
    python -m jobs.launch --preset agentbench-qwen2.5-7b cluster.launcher=slurm cluster.hetjob=false
    python -m jobs.launch --preset agentbench-qwen2.5-7b --render-sbatch > my.sbatch   # to submit by hand

An evaluation (`--eval` first, then jobs.eval's own arguments; its --slurm-* options shape the job):
    python -m jobs.launch --eval runs/demo --tasks os,db --slurm-partition gpu      # sbatch'd, one node
    python -m jobs.launch --eval runs/demo --tasks os,db --render-sbatch           # the script, not submitted
    python -m jobs.launch --eval runs/demo --tasks os,db --local                   # here: jobs.eval itself
The job is `agentrl.evaluation.eval_job.render`'s: one task whose jobs.eval starts the controller, the env
workers and its engine on the node, requeued at will (it resumes from its results file); the script
submitted is kept in runs/eval-jobs/.

Under Slurm (the rendered scripts call it first, in the job): `--prepare-run RUN_DIR` writes
RUN_DIR/config.yaml unless a requeued job left one; `--clear-pipeline RUN_DIR` drops the asynchronous
pipeline's keys from RUN_DIR/rendezvous.json before the script starts its dead MPI world again.
Through submitit the job's function is `agentrl.launch.submit.HetRun`; `job.result()` is the run's
report/summary.json. Roles, steps and groups are those of `agentrl.launch.topology`, for all three ways;
the script is `agentrl.launch.sbatch.render_run`'s.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from agentrl.config import ConfigError, load_config
from agentrl.launch import sbatch

ROOT = Path(__file__).resolve().parents[1]


def launch_eval(argv: list[str]) -> int:
    """`--eval ARGS`: jobs.eval's job, printed (--render-sbatch), run here (--local: jobs.eval itself) or submitted."""
    from agentrl.evaluation.eval_job import eval_argv, job_of, render, submit

    if "--local" in argv or "--render-sbatch" in argv:
        os.execv(sys.executable, [sys.executable, "-m", "jobs.eval", *[a for a in argv if a != "--local"]])
    job = job_of(argv)
    try:
        job_id, path = submit(render(job, eval_argv(argv)), Path("runs/eval-jobs"), job.job_name)
    except (RuntimeError, FileNotFoundError) as e:
        print(f"jobs.launch --eval: {e}", file=sys.stderr)
        return 1
    print(f"submitted Slurm job {job_id} ({path}); its log: {job.job_name}-{job_id}.out", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--eval"]:
        return launch_eval(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="demo", help="a preset name (agentrl/presets) or a YAML path")
    ap.add_argument("--name", help="run name (default: the preset's)")
    ap.add_argument("--render-sbatch", action="store_true", help="print the sbatch script and exit")
    ap.add_argument("--eval", action="store_true", help="(first) launch an evaluation: jobs.eval's arguments follow")
    ap.add_argument("--prepare-run", type=Path, metavar="RUN_DIR", help="(in a job) write RUN_DIR/config.yaml once")
    ap.add_argument("--clear-pipeline", type=Path, metavar="RUN_DIR",
                    help="(in a job) drop the pipeline's keys from RUN_DIR/rendezvous.json before it restarts")
    ap.add_argument("--root", default=str(ROOT),
                    help="--render-sbatch: the repository's path on the compute nodes, where the job runs and what "
                         "the config's relative paths (model, images, binds, cluster.python, run_root) are resolved "
                         "against (default: this checkout); '$SLURM_SUBMIT_DIR' keeps them relative to the submit "
                         "directory")
    ap.add_argument("--folder", default="runs/submitit", help="submitit's folder (slurm launcher)")
    ap.add_argument("--no-wait", action="store_true", help="slurm launcher: print the job id and return")
    ap.add_argument("overrides", nargs="*", help="section.field=value, e.g. cluster.hetjob=false")
    args = ap.parse_args(argv)
    if args.clear_pipeline:
        from agentrl.launch import rendezvous

        cleared = rendezvous.clear_pipeline(args.clear_pipeline)
        print(f"agentrl: cleared the pipeline's rendezvous keys in {args.clear_pipeline}: "
              f"{', '.join(cleared) or 'none were there'}", flush=True)
        return 0
    overrides = list(args.overrides) + ([f"name={args.name}"] if args.name else [])
    try:
        if args.prepare_run:
            from agentrl.launch.prepare import prepare_run

            cfg, resumed = prepare_run(args.preset, overrides, args.prepare_run)
            print(f"agentrl: run dir {args.prepare_run} ({'resuming' if resumed else 'new'})", flush=True)
            return 0
        cfg = load_config(args.preset, overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if args.render_sbatch:
        print(sbatch.render_run(cfg, args.preset, overrides, args.root), end="")
        return 0
    if cfg.cluster.launcher == "local":  # the local launcher is jobs.train's: run it, with these arguments
        os.execv(sys.executable, [sys.executable, "-m", "jobs.train", "--preset", args.preset, *overrides])
    from agentrl.launch import submit

    jobs = submit.submit(cfg, args.preset, overrides, Path(args.folder))
    for job in jobs:
        print(f"submitted Slurm job {job.job_id}; submitit log {job.paths.stdout}", flush=True)
    if args.no_wait:
        return 0
    print(f"result: {jobs[-1].result()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
