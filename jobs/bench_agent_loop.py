"""The agent loop's own cost: our rollout path vs raw vLLM, on one engine, the same requests.

    python -m jobs.bench_agent_loop --model runs/bench/async/model      # a model built by any run
    python -m jobs.bench_agent_loop --model M --episodes 1024 --linger-ms 0,5 --seed 1
    python -m jobs.bench_agent_loop --model M --episodes 64 --concurrency 16 --profile

Every side runs in this one process on the **same** vLLM engine (one `VLLMEngine`, its engine thread), `--repeats`
times interleaved (ours, replay, raw, ours, ...: `agentrl.bench.repeat`), with the prefix cache emptied before each
pass; replay and raw of repeat i replay what ours recorded in repeat i. Measuring the sides in processes of their
own (the earlier design) compared engines, not loops: the same engine's speed moved 14-33 % from one process to the
next, more than the per-turn cost we look for. On one engine, that drift divides out of each pair.

1. Ours: `rollout.collect.collect` plays `--episodes` episodes of the config's tasks (multi-turn, tool calls parsed,
   observations rendered and tokenized, trajectories built) through `VLLMEngine` (the engine thread, asyncio
   futures, per-request log-probs) at `--concurrency` episodes at once. The envs run in this process
   (`InProcessClient`: no HTTP, no latency), so what is measured is the loop, not the envs. Every generation
   request is recorded per episode (`loop_replay.Recording`): prompt ids, budget, tokens made. Its engine lingers
   as the pipeline's does (`rollout.linger_ms`); `--linger-ms 0,5` runs ours with 0 (the headline side)
   and adds a side `ours-linger5ms` with `VLLMEngine(linger_s=0.005)`.
2. Replay, the same structure on raw vLLM (`loop_replay.replay_turns` on the engine's own `LLMEngine`, run on its
   engine thread by `VLLMEngine.run_idle`): each episode's turns in order, turn k+1 added as soon as the step that
   finished turn k returns, `--concurrency` episodes at once, each turn generating exactly as many tokens as ours
   did (eos ignored), with `VLLMEngine`'s own sampling parameters. What separates it from ours is our code per
   turn: rendering and tokenizing, parsing, the env, the trajectory, the hand-offs between the event loop and the
   engine thread.
3. Raw, all at once: one `LLM.generate` over all the recorded prompts, with the same sampling settings and vLLM's
   defaults else (no turn waits for the one before it): an upper bound that no multi-turn loop reaches, since a
   turn's prompt holds the previous turn's tokens.

`agent_loop_over_replay` = ours' generated tokens/s / the replay's within each repeat (the same tokens: the ratio
of their times), what our per-turn work costs; `agent_loop_over_raw` = ours / all-at-once, which also pays for the
turn structure (fewer sequences per step while turns wait for their previous turn); above 1 where a later turn
reuses its earlier turns' cached prefix, which the all-at-once side cannot. The report gives each ratio's median
and min-max over the repeats, each side's figures, and ours' time per turn by stage (`turn_ms_*`, from the
trajectories' `timings`: `agent_loop.STAGES`), the share of the wall time the event loop's thread was busy with
our own work (`loop_busy_frac`) and the engine hand-offs per request (`handoff_*_ms`). `--profile` adds one
cProfile'd pass of ours after the repeats and its costliest functions. The process's CPUs (`--cpus`), its OpenMP
threads (one per CPU) and vLLM's OpenMP binding (`--vllm-bind`) are set before the engine starts. Prints a table
and writes the numbers, with a `machine` record, to `--out` (default runs/bench/agent_loop.json). For a claim, run
the command three times (fresh processes, e.g. `--seed 0/1/2`) and quote what all three show.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from agentrl.bench import repeat
from agentrl.bench.loop_replay import Recording, Turn, profile_top, replay_turns, stage_figures
from agentrl.config import load_config


def linger_values(text: str) -> list[float]:
    """'0,5' -> [0.0, 5.0]: the linger of each side of ours, in ms (the first is the headline side)."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--linger-ms takes numbers separated by commas, got {text!r}") from None
    if not values or any(v < 0 for v in values) or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"--linger-ms needs distinct values >= 0, got {text!r}")
    return values


def ours_side(linger_ms: float, first: bool) -> str:
    return "ours" if first else f"ours-linger{linger_ms:g}ms"


class Bench:
    """One engine, one in-process env client and the episodes to play; each side is a method of it."""

    def __init__(self, model_dir: Path, cfg: Any, episodes: int, concurrency: int, own_process: bool = False) -> None:
        from agentrl.rollout.engine import SamplingConfig, VLLMEngine
        from agentrl.rollout.from_config import chat_format
        from agentrl.rollout.spec import RolloutSpec
        from agentrl.serving.inprocess import InProcessClient
        from agentrl.tasks import get_task, task_name

        self.cfg, self.concurrency = cfg, concurrency
        self.spec = RolloutSpec.from_config(cfg)
        self.fmt = chat_format(cfg, model_dir)
        tasks = {task_name(t): get_task(t, **cfg.envs.task_options.get(t, {})) for t in cfg.envs.tasks}
        self.client = InProcessClient(tasks)
        # own_process: vLLM's EngineCore in a process of its own, as every engine runs on GPU nodes (`devices`
        # given; "" here: no GPU), so its scheduler's Python does not share this process's GIL with the loops
        self.engine = VLLMEngine(str(model_dir), self.spec.limits.max_model_len, max_num_seqs=concurrency,
                                 kv_cache_gib=cfg.cluster.rollout.cpu_kv_cache_gib, seed=cfg.seed,
                                 devices="" if own_process else None)
        self.sampling = SamplingConfig(self.spec.limits.max_new_tokens, cfg.rollout.temperature, cfg.rollout.top_p,
                                       self.fmt.stop_ids)
        self.tasks = list(tasks)
        self.episodes = episodes
        self.reqs: list[tuple[str, str, str]] = []

    async def setup(self) -> None:
        for name in self.tasks:
            train = await self.client.indices(name, "train")
            self.reqs += [(name, train[i % len(train)], f"bench-{name}-{i}")
                          for i in range(self.episodes // len(self.tasks))]

    async def _collect(self, engine: Any, reqs: list[tuple[str, str, str]]) -> list[Any]:
        from agentrl.rollout.collect import collect

        trajs, _ = await collect(self.client, engine, self.fmt, reqs, self.sampling, self.spec.limits,
                                 self.concurrency, 0)
        return trajs

    async def warm_up(self) -> None:
        """Every side's path once on the first episodes (untimed): the engine's first steps, the replay's and the
        all-at-once side's first calls."""
        rec = Recording(self.engine)
        await self._collect(rec, self.reqs[:self.concurrency])
        episodes = list(rec.episodes.values())
        await self.replay(episodes, "warm")
        await self.raw(episodes)

    async def _timed(self, engine: Any, linger_ms: float) -> tuple[list[Any], float, dict[str, float]]:
        """One pass of ours from an empty prefix cache, the engine lingering `linger_ms`: the trajectories, the wall
        time and the per-turn stage figures."""
        from agentrl.rollout.agent_loop import STAGES
        from agentrl.rollout.engine import Handoff

        await self.engine.run_idle(lambda llm: llm.reset_prefix_cache())
        self.engine.linger_s, self.engine.handoff = linger_ms / 1e3, Handoff()
        t0 = time.perf_counter()
        trajs = await self._collect(engine, self.reqs)
        dt = time.perf_counter() - t0
        return trajs, dt, stage_figures(trajs, dt, self.engine.handoff, STAGES)

    async def ours(self, linger_ms: float) -> tuple[dict[str, float], list[list[Turn]]]:
        rec = Recording(self.engine)
        trajs, dt, stages = await self._timed(rec, linger_ms)
        figures = {"tokens_per_s": rec.generated / dt, "seconds": dt, "episodes": float(len(self.reqs)),
                   "turns": float(sum(t.num_turns for t in trajs)), "generated_tokens": float(rec.generated),
                   **stages}
        return figures, list(rec.episodes.values())

    async def replay(self, episodes: list[list[Turn]], tag: str) -> dict[str, float]:
        """The same structure on the engine's own `LLMEngine`, run on its engine thread (no Python of ours
        between a finished turn and the next)."""
        from agentrl.rollout.engine import SamplingConfig, vllm_sampling_params

        s = self.sampling

        def params(n: int) -> Any:
            return vllm_sampling_params(SamplingConfig(max(1, n), s.temperature, s.top_p), ignore_eos=True)

        def run(llm: Any) -> tuple[float, int]:
            llm.reset_prefix_cache()
            t0 = time.perf_counter()
            n = replay_turns(llm.llm_engine, episodes, self.concurrency, params, tag)
            return time.perf_counter() - t0, n

        dt, n = await self.engine.run_idle(run)
        return {"tokens_per_s": n / dt, "seconds": dt, "episodes": float(len(episodes)),
                "turns": float(sum(len(ep) for ep in episodes)), "generated_tokens": float(n)}

    async def raw(self, episodes: list[list[Turn]]) -> dict[str, float]:
        """All recorded requests in one `generate` call: the upper bound, no turn waits for the one before it."""
        from vllm import SamplingParams

        s = self.sampling
        calls = [(p, b) for ep in episodes for p, b, _ in ep]
        prompts = [{"prompt_token_ids": p} for p, _ in calls]
        params = [SamplingParams(max_tokens=b, temperature=s.temperature, top_p=s.top_p, logprobs=0,
                                 stop_token_ids=list(s.stop_token_ids), skip_special_tokens=False) for _, b in calls]

        def run(llm: Any) -> tuple[float, int]:
            llm.reset_prefix_cache()
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            return time.perf_counter() - t0, sum(len(o.outputs[0].token_ids) for o in outs)

        dt, n = await self.engine.run_idle(run)
        return {"tokens_per_s": n / dt, "seconds": dt, "requests": float(len(prompts)), "generated_tokens": float(n)}

    async def profiled(self, linger_ms: float) -> dict[str, Any]:
        """One more pass of ours under cProfile (slower: its figures are the profile's, not a timed pass's)."""
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
        try:
            _, _, stages = await self._timed(self.engine, linger_ms)
        finally:
            prof.disable()
        return {"stages": stages, "top_own_time": profile_top(prof)}


def measure(model_dir: Path, preset: str, overrides: list[str], episodes: int, concurrency: int,
            repeats: int = repeat.MIN_REPEATS, linger_ms: list[float] | None = None,
            profile: bool = False, own_process: bool = False) -> dict[str, Any]:
    """Build the engine, warm every side up, then run the sides interleaved `repeats` times on it. `linger_ms`:
    one side of ours per value, the first the headline (None: the config's `rollout.linger_ms` alone)."""
    cfg = load_config(preset, overrides, trains=False)
    lingers = linger_ms or [cfg.rollout.linger_ms]
    loop = asyncio.new_event_loop()
    bench = Bench(model_dir, cfg, episodes, concurrency, own_process)
    recorded: dict[int, list[list[Turn]]] = {}
    try:
        loop.run_until_complete(bench.setup())
        loop.run_until_complete(bench.warm_up())

        def ours(value: float, first: bool) -> Any:
            def run(i: int) -> dict[str, float]:
                figures, episodes_ = loop.run_until_complete(bench.ours(value))
                if first:
                    recorded[i] = episodes_
                return figures
            return run

        sides = {ours_side(v, k == 0): ours(v, k == 0) for k, v in enumerate(lingers)}
        sides["replay"] = lambda i: loop.run_until_complete(bench.replay(recorded[i], f"r{i}"))
        sides["raw_vllm"] = lambda i: loop.run_until_complete(bench.raw(recorded[i]))
        samples = repeat.interleave(sides, repeats, echo=lambda line: print(line, file=sys.stderr, flush=True))
        prof = loop.run_until_complete(bench.profiled(lingers[0])) if profile else None
    finally:
        bench.engine.close()
        loop.close()
    names = list(sides)[:len(lingers)]
    wanted = [repeat.Ratio("agent_loop_over_replay", "ours", "tokens_per_s", "replay", "tokens_per_s"),
              repeat.Ratio("agent_loop_over_raw", "ours", "tokens_per_s", "raw_vllm", "tokens_per_s")]
    wanted += [repeat.Ratio(f"{n.replace('-', '_')}_over_replay", n, "tokens_per_s", "replay", "tokens_per_s")
               for n in names[1:]]
    spread = repeat.summarize(samples, wanted)
    out = {**{name: round(s["median"], 3) for name, s in spread["ratios"].items()},
           **{name: {k: round(v["median"], 4) for k, v in figs.items()} for name, figs in spread["sides"].items()},
           "repeats": spread,
           "setup": {"episodes": episodes, "concurrency": concurrency, "tasks": list(cfg.envs.tasks),
                     "repeats": repeats, "cpus": os.cpu_count(), "linger_ms": lingers, "one_engine": True,
                     "engine_process": "own" if own_process else "this"}}
    if prof is not None:
        out["profile"] = prof
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="a model directory (e.g. RUN_DIR/model)")
    ap.add_argument("--preset", default="smoke", help="whose tasks and rollout limits to use")
    ap.add_argument("--episodes", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--out", type=Path, default=Path("runs/bench/agent_loop.json"))
    ap.add_argument("--seed", type=int, default=None, help="sets `seed=` (the config's seed otherwise)")
    ap.add_argument("--profile", action="store_true",
                    help="after the repeats, one more pass of ours under cProfile: the per-turn stages and the event "
                         "loop's costliest functions go into the JSON under `profile`")
    ap.add_argument("--linger-ms", type=linger_values, default=None,
                    help="`VLLMEngine(linger_s=)` of ours, in ms: how long its engine thread waits for the next turns "
                         "after a step that finished requests (default: the config's rollout.linger_ms); a "
                         "list (0,5) runs one side of ours per value, the first the headline")
    ap.add_argument("--own-process", action="store_true",
                    help="run the engine's EngineCore in a process of its own (as on GPU nodes) instead of in this "
                         "one (the CPU default): its scheduler then does not share the event loop's GIL")
    repeat.add_args(ap)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    if args.episodes < 1 or args.concurrency < 1:
        ap.error("--episodes and --concurrency must be >= 1")
    if args.seed is not None:
        args.overrides = [*args.overrides, f"seed={args.seed}"]
    load_before = os.getloadavg()
    cpus = repeat.parse_cpus(args.cpus)
    env = repeat.pin(cpus, None, args.vllm_bind)
    os.environ.update(env)  # the engine starts in this process: its OpenMP reads these at start
    result = measure(args.model, args.preset, args.overrides, args.episodes, args.concurrency, args.repeats,
                     args.linger_ms, args.profile, args.own_process)
    seed = load_config(args.preset, args.overrides, trains=False).seed
    result["machine"] = repeat.machine(seed, cpus, env, load_before)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(repeat.table(result["repeats"]))
    print(f"agent loop / same-structure replay {result['agent_loop_over_replay']}, / all requests at once "
          f"{result['agent_loop_over_raw']} (medians of {args.repeats} repeats on one engine); written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
