"""The agent loop's own cost: our rollout path vs raw vLLM, same model, same requests.

    python -m jobs.bench_agent_loop --model runs/bench/async/model      # a model built by any run
    python -m jobs.bench_agent_loop --model M --episodes 64 --concurrency 16 --profile

Three sides, each in a process of its own (a warm-up pass, then one timed pass), `--repeats` times interleaved
(ours, replay, raw, ours, ... : `agentrl.bench.repeat`); replay and raw of repeat i replay what ours recorded in i.

1. Ours: `rollout.collect.collect` plays `--episodes` episodes of the config's tasks (multi-turn, tool calls parsed,
   observations rendered and tokenized, trajectories built) through our `VLLMEngine` (its engine thread,
   asyncio futures, per-request log-probs), at `--concurrency` episodes at once. The envs run in this
   process (`InProcessClient`: no HTTP, no latency), so what is measured is the loop, not the envs.
   Every generation request is recorded per episode (`loop_replay.Recording`): prompt ids, budget, tokens made.
2. Replay, the same structure on raw vLLM (`loop_replay.replay_turns` on `LLM.llm_engine`): each episode's turns
   in order, turn k+1 added as soon as the step that finished turn k returns, `--concurrency` episodes at once,
   each turn generating exactly as many tokens as ours did (eos ignored), with `VLLMEngine`'s own sampling
   parameters. What separates it from ours is our code per turn: rendering and tokenizing, parsing, the env,
   the trajectory, the hand-offs between the event loop and the engine thread.
3. Raw, all at once: a fresh `vllm.LLM` generates for all the recorded prompts in one `generate` call, with the
   same sampling settings and vLLM's defaults else (no turn waits for the one before it): an upper bound that
   no multi-turn loop reaches, since a turn's prompt holds the previous turn's tokens.

Both sides' processes get the same CPUs (`--cpus`, this process's affinity, inherited), the same
OMP_NUM_THREADS (one per CPU) and the same vLLM OpenMP binding (`--vllm-bind`, VLLM_CPU_OMP_THREADS_BIND,
`nobind` by default: the engines stay on the affinity mask).

`agent_loop_over_replay` = ours' generated tokens/s / the replay's within each repeat (the same tokens: the ratio
of their times), what our per-turn work costs; `agent_loop_over_raw` = ours / all-at-once, which also pays for the
turn structure (fewer sequences per step while turns wait for their previous turn); above 1 where a later turn
reuses its earlier turns' cached prefix, which the all-at-once side cannot. The report gives each ratio's median
and min-max over the repeats, each side's figures, and ours' time per turn by stage (`turn_ms_*`, from the
trajectories' `timings`: `agent_loop.STAGES`), the share of the wall time the event loop's thread was busy with
our own work (`loop_busy_frac`) and the engine hand-offs per request (`handoff_*_ms`). `--profile` adds one
cProfile'd pass of ours (repeat 1) and its costliest functions; `--linger-ms` sets ours' `VLLMEngine(linger_s=)`.
Prints a table and writes the numbers, with a `machine` record, to `--out` (default runs/bench/agent_loop.json).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from agentrl.bench import repeat
from agentrl.bench.loop_replay import Recording, profile_top, replay_turns, stage_figures
from agentrl.config import load_config


async def ours(model_dir: Path, cfg: Any, episodes: int, concurrency: int, profile: bool = False,
               linger_ms: float = 0.0) -> tuple[dict[str, float], Recording, dict[str, Any] | None]:
    from agentrl.envs.inprocess import InProcessClient
    from agentrl.envs.tasks import get_task, task_name
    from agentrl.rollout.agent_loop import STAGES
    from agentrl.rollout.collect import collect
    from agentrl.rollout.engine import Handoff, SamplingConfig, VLLMEngine
    from agentrl.rollout.from_config import chat_format
    from agentrl.rollout.plan import RolloutPlan

    plan = RolloutPlan.from_config(cfg)
    fmt = chat_format(cfg, model_dir)
    tasks = {task_name(t): get_task(t, **cfg.envs.task_options.get(t, {})) for t in cfg.envs.tasks}
    client = InProcessClient(tasks)
    engine = VLLMEngine(str(model_dir), plan.limits.max_model_len, max_num_seqs=concurrency, seed=cfg.seed,
                        linger_s=linger_ms / 1e3)
    prof_out = None
    try:
        sampling = SamplingConfig(plan.limits.max_new_tokens, plan.temperature, plan.top_p, fmt.stop_ids)
        reqs = []
        for name in tasks:
            train = await client.indices(name, "train")
            reqs += [(name, train[i % len(train)], f"bench-{name}-{i}") for i in range(episodes // len(tasks))]
        await collect(client, engine, fmt, reqs[:concurrency], sampling, plan.limits, concurrency, 0)  # warm-up
        rec = Recording(engine)
        engine.handoff = Handoff()
        t0 = time.perf_counter()
        trajs, _ = await collect(client, rec, fmt, reqs, sampling, plan.limits, concurrency, 0)
        dt = time.perf_counter() - t0
        stages = stage_figures(trajs, dt, engine.handoff, STAGES)
        if profile:  # one more pass under cProfile (slower: its figures are the profile's, not the timed pass's)
            import cProfile

            prof = cProfile.Profile()
            engine.handoff = Handoff()
            t1 = time.perf_counter()
            prof.enable()
            ptrajs, _ = await collect(client, engine, fmt, reqs, sampling, plan.limits, concurrency, 0)
            prof.disable()
            prof_out = {"stages": stage_figures(ptrajs, time.perf_counter() - t1, engine.handoff, STAGES),
                        "top_own_time": profile_top(prof)}
    finally:
        engine.close()
    return {"tokens_per_s": rec.generated / dt, "seconds": dt, "episodes": float(len(reqs)),
            "turns": float(sum(t.num_turns for t in trajs)), "generated_tokens": float(rec.generated),
            **stages}, rec, prof_out


def _llm(model_dir: Path, cfg: Any, concurrency: int) -> Any:
    """A fresh `vllm.LLM` built as `VLLMEngine` builds its own."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # as `VLLMEngine` sets them
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.rollout.kv_cache_gib))
    from vllm import LLM

    return LLM(model=str(model_dir), dtype="float32", max_model_len=cfg.rollout.max_model_len, enforce_eager=True,
               max_num_seqs=concurrency, seed=cfg.seed, logprobs_mode="processed_logprobs")


def _in_thread(fn: Any) -> None:
    """Run `fn` in a thread of its own, as `VLLMEngine` steps its engine: vLLM's CPU backend pins the OpenMP
    threads of the thread that built the engine, and stepping from that (main) thread ran 15x slower here beside
    other work (185 vs 2,726 tokens/s, same requests) - a baseline no deployment of ours would see."""
    worker = threading.Thread(target=fn, name="raw-vllm")
    worker.start()
    worker.join()


def raw(model_dir: Path, cfg: Any, calls: list[tuple[list[int], int]], concurrency: int) -> dict[str, float]:
    """All recorded requests in one `generate` call: the upper bound, no turn waits for the one before it."""
    from vllm import SamplingParams

    from agentrl.rollout.from_config import chat_format

    r = cfg.rollout
    stops = list(chat_format(cfg, model_dir).stop_ids)
    llm = _llm(model_dir, cfg, concurrency)

    def params(budget: int) -> Any:  # a plain request: the sampling settings ours asks for, vLLM's defaults else
        return SamplingParams(max_tokens=budget, temperature=r.temperature, top_p=r.top_p, logprobs=0,
                              stop_token_ids=stops, skip_special_tokens=False)

    prompts = [{"prompt_token_ids": p} for p, _ in calls]
    result: dict[str, Any] = {}

    def generate() -> None:
        llm.generate(prompts[:concurrency], [params(b) for _, b in calls[:concurrency]], use_tqdm=False)  # warm-up
        t0 = time.perf_counter()
        outs = llm.generate(prompts, [params(b) for _, b in calls], use_tqdm=False)
        result.update(dt=time.perf_counter() - t0, n=sum(len(o.outputs[0].token_ids) for o in outs))

    _in_thread(generate)
    dt, n = result["dt"], result["n"]
    return {"tokens_per_s": n / dt, "seconds": dt, "requests": float(len(prompts)), "generated_tokens": float(n)}


def replay(model_dir: Path, cfg: Any, episodes: list[list[tuple[list[int], int, int]]],
           concurrency: int) -> dict[str, float]:
    """The same structure on raw vLLM: each episode's turns in order (turn k+1 is added when turn k's generation
    returns, with no Python of ours between), `concurrency` episodes at once (the next starts when one ends),
    each turn generating exactly the tokens ours generated (its recorded count: no stop token, eos ignored).
    The sampling settings are `VLLMEngine`'s own (`vllm_sampling_params`), so the difference to ours is the loop:
    tokenizing, parsing, the env, the trajectory and the engine thread's hand-offs."""
    from agentrl.rollout.engine import SamplingConfig, vllm_sampling_params

    r = cfg.rollout
    llm = _llm(model_dir, cfg, concurrency)
    engine = llm.llm_engine

    def params(n: int) -> Any:
        return vllm_sampling_params(SamplingConfig(max(1, n), r.temperature, r.top_p), ignore_eos=True)

    result: dict[str, Any] = {}

    def run() -> None:
        warm = [ep[:1] for ep in episodes[:concurrency]]  # as ours' warm-up: the first episodes' first prompts
        replay_turns(engine, warm, concurrency, params, "warm")
        t0 = time.perf_counter()
        n = replay_turns(engine, episodes, concurrency, params, "timed")
        result.update(dt=time.perf_counter() - t0, n=n)

    _in_thread(run)
    dt, n = result["dt"], result["n"]
    return {"tokens_per_s": n / dt, "seconds": dt, "episodes": float(len(episodes)),
            "turns": float(sum(len(ep) for ep in episodes)), "generated_tokens": float(n)}


def measure(model_dir: Path, preset: str, overrides: list[str], episodes: int, concurrency: int,
            work: Path, repeats: int = repeat.MIN_REPEATS, env: dict[str, str] | None = None,
            profile: bool = False, linger_ms: float = 0.0) -> dict[str, Any]:
    """Each side in its own process: two vLLM engines in one process bind their threads to the same cores
    (seen here: the second ran 10x slower than alone). Sides interleaved, `repeats` times; `env`: what every
    side's process gets on top of this one's environment (threads, vLLM binding)."""
    cfg = load_config(preset, overrides)
    work.mkdir(parents=True, exist_ok=True)
    common = [sys.executable, "-m", "jobs.bench_agent_loop", "--model", str(model_dir), "--preset", preset,
              "--episodes", str(episodes), "--concurrency", str(concurrency), "--work", str(work),
              "--linger-ms", str(linger_ms)]

    def side(phase: str) -> Any:
        def run(i: int) -> dict[str, float]:
            extra = ["--profile"] if profile and phase == "ours" and i == 0 else []
            with open(work / f"{phase}-{i}.log", "w") as log:
                subprocess.run([*common, "--phase", phase, "--repeat-index", str(i), *extra, *overrides], check=True,
                               stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, **(env or {})})
            return json.loads((work / f"{phase}-{i}.json").read_text())
        return run

    samples = repeat.interleave({"ours": side("ours"), "replay": side("replay"), "raw_vllm": side("raw")}, repeats,
                                echo=lambda line: print(line, file=sys.stderr, flush=True))
    spread = repeat.summarize(samples, [
        repeat.Ratio("agent_loop_over_replay", "ours", "tokens_per_s", "replay", "tokens_per_s"),
        repeat.Ratio("agent_loop_over_raw", "ours", "tokens_per_s", "raw_vllm", "tokens_per_s")])
    out = {"agent_loop_over_replay": round(spread["ratios"]["agent_loop_over_replay"]["median"], 3),
           "agent_loop_over_raw": round(spread["ratios"]["agent_loop_over_raw"]["median"], 3),
           **{name: {k: round(v["median"], 4) for k, v in figs.items()} for name, figs in spread["sides"].items()},
           "repeats": spread,
           "setup": {"episodes": episodes, "concurrency": concurrency, "tasks": list(cfg.envs.tasks),
                     "repeats": repeats, "cpus": os.cpu_count(), "linger_ms": linger_ms}}
    if profile:
        out["profile"] = json.loads((work / "profile-0.json").read_text())
    return out


def _phase(args: argparse.Namespace) -> None:
    cfg = load_config(args.preset, args.overrides)
    i = args.repeat_index
    calls_file = args.work / f"calls-{i}.json"
    if args.phase == "ours":
        mine, rec, prof = asyncio.run(ours(args.model, cfg, args.episodes, args.concurrency, args.profile,
                                           args.linger_ms))
        calls_file.write_text(json.dumps({"episodes": list(rec.episodes.values())}))
        (args.work / f"ours-{i}.json").write_text(json.dumps(mine))
        if prof is not None:
            (args.work / f"profile-{i}.json").write_text(json.dumps(prof, indent=1))
        return
    episodes = [[(p, b, n) for p, b, n in ep] for ep in json.loads(calls_file.read_text())["episodes"]]
    if args.phase == "replay":
        figures = replay(args.model, cfg, episodes, args.concurrency)
    else:
        figures = raw(args.model, cfg, [(p, b) for ep in episodes for p, b, _ in ep], args.concurrency)
    (args.work / f"{args.phase}-{i}.json").write_text(json.dumps(figures))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="a model directory (e.g. RUN_DIR/model)")
    ap.add_argument("--preset", default="smoke", help="whose tasks and rollout limits to use")
    ap.add_argument("--episodes", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--out", type=Path, default=Path("runs/bench/agent_loop.json"))
    ap.add_argument("--work", type=Path, default=Path("runs/bench/agent_loop"), help="each phase's files")
    ap.add_argument("--phase", choices=("ours", "replay", "raw"), help=argparse.SUPPRESS)  # one side, own process
    ap.add_argument("--repeat-index", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=None, help="sets `seed=` (the config's seed otherwise)")
    ap.add_argument("--profile", action="store_true",
                    help="after ours' timed pass of repeat 1, one more pass under cProfile: the per-turn stages and "
                         "the event loop's costliest functions go into the JSON under `profile`")
    ap.add_argument("--linger-ms", type=float, default=0.0,
                    help="`VLLMEngine(linger_s=)` of ours: how long its engine thread waits for the next turns "
                         "after a step that finished requests")
    repeat.add_args(ap)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    if args.seed is not None:
        args.overrides = [*args.overrides, f"seed={args.seed}"]
    if args.phase:
        _phase(args)
        return 0
    load_before = os.getloadavg()
    cpus = repeat.parse_cpus(args.cpus)
    env = repeat.pin(cpus, None, args.vllm_bind)
    result = measure(args.model, args.preset, args.overrides, args.episodes, args.concurrency, args.work,
                     args.repeats, env, args.profile, args.linger_ms)
    result["machine"] = repeat.machine(load_config(args.preset, args.overrides).seed, cpus, env, load_before)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(repeat.table(result["repeats"]))
    print(f"agent loop / same-structure replay {result['agent_loop_over_replay']}, / all requests at once "
          f"{result['agent_loop_over_raw']} (medians of {args.repeats} repeats); written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
