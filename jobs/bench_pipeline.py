"""The synchronous and the asynchronous schedule side by side: same model, tasks, number of trained
trajectories and machine, through the real roles (controller, env worker, vLLM, trainer, MPI), with env
latency that has a long tail (lognormal, p99 ≈ 10× the median: `rollout.env_latency_s`).

    python -m jobs.bench_pipeline --quick      # ~15 minutes on 2 cores (3 repeats of each schedule)
    python -m jobs.bench_pipeline              # longer runs, steadier numbers
    python -m jobs.bench_pipeline --latency 0.5 --sigma 0.99 --staleness 1 --ranks 1 --repeats 5 --cpus 0-3

Each schedule runs `python -m jobs.train` (the same entry point a user runs) in runs/bench/<schedule>/, `--repeats`
times (at least 3), interleaved: sync, async, sync, async, ... (`agentrl.bench.repeat`). The synchronous schedule
is the same pipeline as the asynchronous one with its numbers fixed (`RunConfig.pipeline`: max_staleness 0, one
step's groups per step, one rollout rank), so the comparison is of the two settings through the same roles.
The bench watches report/trainer.json and notes when each step finishes. Throughput is measured in the
steady state: trajectories trained in steps 2..N over the time from the end of step 1 to the end of step N,
so that the engines' start-up and the pipeline's fill (the same for both) do not dilute it; the end-to-end
figure (from weights v0 to the last step) is written too. `rollout_over_raw_vllm` is the agent loop's
own cost (`jobs.bench_agent_loop` on the last async run's model, with the same repeats: our loop's generated
tokens/s over vLLM `generate` on exactly the requests our loop made, envs in process, every side on one
engine).

The async run splits the cores between trainer and engine (`--threads`, default half each; a list measures
each split as a side and names the fastest): on a small machine a trainer and an engine that both start a
thread per core oversubscribe it while they run at once; the sync run's phases take turns, so each gets
every core. Both schedules run on the same `--cpus`
(this process's affinity, which every role inherits) with the same vLLM OpenMP binding (`--vllm-bind`).

Results: a table of the median and min-max over the repeats of each schedule's figures and of the per-repeat
ratio async/sync (each repeat's two runs ran next to each other), the `machine` record (CPU model, affinity,
load average before and after, versions, command, seed), printed and written to runs/bench/pipeline.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agentrl.bench import repeat
from agentrl.bench.pipeline import async_variants, best_splits, parse_splits, ratio_tag, throughput
from agentrl.monitor.balance import async_figures, pipeline_bound

ROOT = Path(__file__).resolve().parents[1]


def overrides(quick: bool, latency: float, sigma: float, steps: int = 0, prompts: int = 0,
              concurrency: int = 64) -> list[str]:
    """What both schedules share: the smoke model, a short warm start, the same batch and step count, the
    episodes a rank keeps in flight (the sync schedule's step holds fewer: one step's groups)."""
    steps, prompts = steps or (5 if quick else 10), prompts or (4 if quick else 8)
    return [f"trainer.steps={steps}", f"rollout.groups_per_task={prompts}", "rollout.group_size=4",
            "rollout.max_turns=3", f"rollout.concurrency={concurrency}", "rollout.eval_samples=1",
            "rollout.eval_sampled=0",
            "trainer.checkpoint_every=0", "cluster.role_timeout_s=600", f"rollout.env_latency_s={latency}",
            f"rollout.env_latency_sigma={sigma}"]


def run_schedule(root: Path, name: str, extra: list[str], timeout_s: float = 900.0, log_name: str = "",
                 env: dict[str, str] | None = None) -> dict[str, Any]:
    """`jobs.train` for one schedule (in root/name, which it replaces); returns the step completion times and the
    run's reports. `env`: added to the run's environment (the pinned threads and binding)."""
    run_dir = root / name
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "jobs.train", "--preset", "smoke", "--name", name, "--fresh", f"run_root={root}",
           *extra]
    log = open(root / f"{log_name or name}.out", "w")
    t_launch = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"})
    step_t: dict[int, float] = {}
    t_v0: float | None = None
    report = run_dir / "report" / "trainer.json"
    try:
        while proc.poll() is None:
            now = time.time()
            if t_v0 is None and (run_dir / "weights" / "v0" / "model.safetensors").exists():
                t_v0 = now
            try:
                done = int(json.loads(report.read_text())["steps_done"])
            except (OSError, ValueError, KeyError):
                done = 0
            for k in range(1, done + 1):
                step_t.setdefault(k, now)
            if now - t_launch > timeout_s:
                raise TimeoutError(f"{name}: still running after {timeout_s:.0f}s (see {log.name})")
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(30)
        log.close()
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed (rc {proc.returncode}); see {log.name}")
    trainer = json.loads(report.read_text())
    rollout = [json.loads(p.read_text()) for p in sorted((run_dir / "report").glob("rollout-*.json"))]
    return {"run_dir": run_dir, "step_t": step_t, "t_v0": t_v0, "trainer": trainer, "rollout": rollout,
            "wall_s": time.time() - t_launch}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small runs (about 4 minutes per repeat on 2 cores)")
    ap.add_argument("--latency", type=float, default=0.3, help="median env latency per env call, seconds")
    ap.add_argument("--sigma", type=float, default=0.99, help="lognormal sigma (0.99: p99 = 10x median)")
    ap.add_argument("--staleness", default="1",
                    help="algo.max_staleness of the async run; a list (1,4) runs one async side per value")
    ap.add_argument("--ranks", default="1",
                    help="rollout ranks of the async run (sync runs one); a list (1,2) runs one async side each")
    ap.add_argument("--steps", type=int, default=0, help="RL steps of each run (default: 5 quick, 10 full)")
    ap.add_argument("--prompts", type=int, default=0, help="rollout.groups_per_task (default: 4 quick, 8 full)")
    ap.add_argument("--concurrency", type=int, default=64,
                    help="rollout.concurrency: episodes a rollout rank keeps in flight (the async side's admission "
                         "cap beside its staleness window; a sync step holds one step's groups, fewer than 64)")
    ap.add_argument("--threads", default="",
                    help="TRAINER:ENGINE threads of the async run (default: the cores split in two, so trainer "
                         "and engine never share a core while both run; the sync run's phases take turns and "
                         "each gets every core); a list (1:1,1:2) measures each split as a side of its own and "
                         "names the one with the highest throughput (`best_split`)")
    ap.add_argument("--sync-engine-threads", default="",
                    help="cluster.engine_threads of the sync run (default: every core, its trainer too); a list "
                         "(2,1) adds one more sync side per further value (sync-e1, ...), each with its ratio to "
                         "the first; the async ratios stay against the first")
    ap.add_argument("--loop-episodes", type=int, default=1024,
                    help="episodes of the agent-loop measurement (fewer: the last wave's part-empty batch weighs "
                         "more; 256 at 64 at once measured 0.72 where 1024 measured 0.96); 0 leaves it out "
                         "(run jobs.bench_agent_loop on its own, e.g. with --vllm-bind)")
    ap.add_argument("--seed", type=int, default=0, help="run seed (model, env latency draws, sampling)")
    ap.add_argument("--root", type=Path, default=Path("runs/bench"))
    repeat.add_args(ap)
    args = ap.parse_args(argv)
    load_before = os.getloadavg()
    cpus = repeat.parse_cpus(args.cpus)
    env = repeat.pin(cpus, None, args.vllm_bind)
    root = args.root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    common = overrides(args.quick, args.latency, args.sigma, args.steps, args.prompts, args.concurrency) + [
        f"seed={args.seed}"]
    from agentrl.config import load_config

    cfg = load_config("smoke", common)
    per_step = cfg.rollout.groups_per_task * len(cfg.envs.tasks) * cfg.rollout.group_size

    print(f"bench: {cfg.trainer.steps} steps x {per_step} trajectories, env latency lognormal median "
          f"{args.latency}s sigma {args.sigma}, {args.repeats} repeats of each schedule on CPUs {cpus}", flush=True)
    cores = len(cpus)
    try:
        splits = parse_splits(args.threads, (max(cores // 2, 1), max(cores - cores // 2, 1)))
    except ValueError as e:
        ap.error(str(e))
    t_train, t_engine = splits[0]
    try:
        sync_engine = [int(x) for x in args.sync_engine_threads.split(",") if x] or [cores]
        if any(e < 1 for e in sync_engine) or len(set(sync_engine)) != len(sync_engine):
            raise ValueError
    except ValueError:
        ap.error(f"--sync-engine-threads {args.sync_engine_threads!r}: distinct thread counts >= 1")
    schedules = {("sync" if i == 0 else f"sync-e{e}"): common + ["cluster.schedule=sync", f"trainer.threads={cores}",
                                                                 f"cluster.engine_threads={e}"]
                 for i, e in enumerate(sync_engine)}
    sync_sides = list(schedules)
    try:
        variants = async_variants(args.staleness, args.ranks, splits)
    except ValueError as e:
        ap.error(str(e))
    for name, (staleness, ranks, threads, engine) in variants.items():
        schedules[name] = common + ["cluster.schedule=async", f"cluster.rollout.ranks={ranks}",
                                    f"algo.max_staleness={staleness}", f"trainer.threads={threads}",
                                    f"cluster.engine_threads={engine}"]

    def side(name: str) -> Any:
        def run(i: int) -> dict[str, float]:
            r = run_schedule(root, name, schedules[name], log_name=f"{name}-{i}", env=env)
            tps, e2e = throughput(r["step_t"], r["t_v0"], per_step)
            figs = {"traj_per_s": tps, "e2e_traj_per_s": e2e, "wall_s": r["wall_s"]}
            if name not in sync_sides:
                figs.update(async_figures(r["trainer"], r["rollout"]))
            return figs
        return run

    samples = repeat.interleave({name: side(name) for name in schedules}, args.repeats,
                                echo=lambda line: print(line, flush=True))
    wanted = [r for name in variants for r in (
        repeat.Ratio(f"async_over_sync{ratio_tag(name)}", name, "traj_per_s", "sync", "traj_per_s"),
        repeat.Ratio(f"async_over_sync_e2e{ratio_tag(name)}", name, "e2e_traj_per_s", "sync", "e2e_traj_per_s"))]
    wanted += [repeat.Ratio(f"{name.replace('-', '_')}_over_sync", name, "traj_per_s", "sync", "traj_per_s")
               for name in sync_sides[1:]]
    spread = repeat.summarize(samples, wanted)
    loop_out = root / "agent_loop.json"  # jobs.bench_agent_loop, as its own entry point, on the last async model
    loop: dict[str, Any] = {"agent_loop_over_raw": None, "agent_loop_over_replay": None}
    if args.loop_episodes > 0:
        subprocess.run([sys.executable, "-m", "jobs.bench_agent_loop", "--model", str(root / "async" / "model"),
                        "--preset", "smoke", "--episodes", str(args.loop_episodes), "--concurrency",
                        str(cfg.rollout.concurrency), "--out", str(loop_out),
                        "--repeats", str(args.repeats), "--cpus", ",".join(map(str, cpus)), "--vllm-bind",
                        args.vllm_bind, *common], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        loop = json.loads(loop_out.read_text())
        print(f"agent loop vs the same-structure replay: {loop['agent_loop_over_replay']}, vs all requests at once: "
              f"{loop['agent_loop_over_raw']} (medians of {args.repeats})", flush=True)
    med = {side: {k: v["median"] for k, v in figs.items()} for side, figs in spread["sides"].items()}
    ratios = spread["ratios"]
    result = {  # medians over the repeats; the spread of each is under "repeats"
        "sync_traj_per_s": round(med["sync"]["traj_per_s"], 3),
        "sync_variants": {name: {"engine_threads": e, "traj_per_s": round(med[name]["traj_per_s"], 3),
                                 "e2e_traj_per_s": round(med[name]["e2e_traj_per_s"], 3),
                                 **({"over_sync": round(ratios[f"{name.replace('-', '_')}_over_sync"]["median"], 3)}
                                    if name != "sync" else {})}
                          for name, e in zip(sync_sides, sync_engine)},
        "async_traj_per_s": round(med["async"]["traj_per_s"], 3),
        "async_over_sync": round(ratios["async_over_sync"]["median"], 3),
        "trainer_idle_frac": round(med["async"]["trainer_idle_frac"], 3),
        "staleness_mean": round(med["async"]["staleness_mean"], 3),
        "staleness_max": int(spread["sides"]["async"]["staleness_max"]["max"]),
        "rollout_over_raw_vllm": loop["agent_loop_over_raw"], "rollout_over_replay": loop["agent_loop_over_replay"],
        "end_to_end": {"sync_traj_per_s": round(med["sync"]["e2e_traj_per_s"], 3),
                       "async_traj_per_s": round(med["async"]["e2e_traj_per_s"], 3),
                       "async_over_sync": round(ratios["async_over_sync_e2e"]["median"], 3)},
        "agent_loop": loop, "async_rollout_tokens_per_s": round(med["async"]["rollout_tokens_per_s"], 1),
        "rollout_idle_frac": round(med["async"]["rollout_idle_frac"], 3),
        "window_bound_frac": round(med["async"]["window_bound_frac"], 3),
        "variants": {name: {"max_staleness": v[0], "rollout_ranks": v[1], "threads": f"{v[2]}:{v[3]}",
                            **{k: round(x, 3) for k, x in med[name].items()},
                            "async_over_sync": round(ratios[f"async_over_sync{ratio_tag(name)}"]["median"], 3),
                            "async_over_sync_e2e": round(ratios[f"async_over_sync_e2e{ratio_tag(name)}"]["median"], 3),
                            "bound": pipeline_bound(med[name]["trainer_idle_frac"], med[name]["window_bound_frac"],
                                                    med[name]["in_flight_mean"] / (v[1] * cfg.rollout.concurrency))}
                     for name, v in variants.items()},
        "best_split": best_splits(variants, {name: med[name]["traj_per_s"] for name in variants}),
        "repeats": spread,
        "setup": {"steps": cfg.trainer.steps, "trajectories_per_step": per_step, "quick": args.quick,
                  "seed": args.seed, "loop_episodes": args.loop_episodes, "repeats": args.repeats,
                  "env_latency_median_s": args.latency, "env_latency_sigma": args.sigma,
                  "async_max_staleness": variants["async"][0], "async_rollout_ranks": variants["async"][1],
                  "async_variants": {k: {"max_staleness": v[0], "rollout_ranks": v[1], "threads": f"{v[2]}:{v[3]}"}
                                     for k, v in variants.items()},
                  "async_threads": {"trainer": t_train, "engine": t_engine}, "sync_threads": cores,
                  "sync_engine_threads": sync_engine,
                  "cpus": cpus},
        "machine": repeat.machine(args.seed, cpus, env, load_before),
    }
    (root / "pipeline.json").write_text(json.dumps(result, indent=2))
    print(repeat.table(spread))
    for name, v in result["variants"].items():
        print(f"{name} (max_staleness {v['max_staleness']}, {v['rollout_ranks']} rollout rank(s), threads "
              f"{v['threads']}): "
              f"{v['async_over_sync']}x sync steady, {v['async_over_sync_e2e']}x end to end, trainer idle "
              f"{v['trainer_idle_frac']}, at the staleness window {v['window_bound_frac']}: bound by {v['bound']}")
    for key, v in result["best_split"].items():
        print(f"split at {key}: best {v['best']} (trainer:engine threads) of steady traj/s {v['traj_per_s']}")
    for name, v in result["sync_variants"].items():
        if name != "sync":
            print(f"{name} (sync, {v['engine_threads']} engine thread(s)): {v['over_sync']}x the first sync side")
    if args.loop_episodes > 0:
        print(f"agent loop / same-structure replay {loop['agent_loop_over_replay']}, / raw vLLM all at once "
              f"{loop['agent_loop_over_raw']} (medians; spread in {loop_out})")
    print(f"written to {root / 'pipeline.json'}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
