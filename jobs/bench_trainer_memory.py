"""Peak host memory of a trainer rank: the old way of building the models against `agentrl.trainer.model_load`.

    python -m jobs.bench_trainer_memory                       # Qwen2.5-0.5B's shape, 2 gloo ranks, FSDP2, 3 rounds
    python -m jobs.bench_trainer_memory --layers 4 --rounds 3 # smaller, faster

Both sides build what a trainer rank builds before its first step — the policy (FSDP2 over 2 CPU ranks),
the KL reference, and the whole weights on rank 0 for publishing — from one random-weight bf16 model
directory written first:

    before  every rank `from_pretrained` in float32, then sharded; the reference likewise, in float32;
            publishing gathers a float32 state dict on rank 0
    after   meta-device build, each rank reads the rows of its own shards from the file; the reference in
            bf16 (the compute dtype); publishing streams the gathered tensors, one at a time in bf16, into
            weights/v1 (`learner.stage_weights`, as the trainer publishes)

With `--train` each side then takes one AdamW step and writes a checkpoint (phases "step", "checkpoint"):
gradients and Adam's two moments (three float32 copies of each rank's shard) come on top there.

Each rank reports its peak RSS (`ru_maxrss`) from a fresh process, and after each phase the peak so far and
the RSS then (the phase that raised the peak is the first whose peak so far is the final one); the sides
alternate (A B A B A B), and the output gives each side's median and min-max per rank and the ratio, written
to runs/bench/trainer_memory.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path


def build(out: Path, layers: int) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    if (out / "config.json").exists():
        return out
    cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=layers,
                      num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=True, dtype="bfloat16")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    return out


class Phases:
    """Each phase's mark: the peak RSS so far (`ru_maxrss`) and the RSS now (VmRSS), in MiB, so the phase that
    raised the peak is the first whose `peak_mib` reaches the final one."""

    def __init__(self) -> None:
        self.marks: list[dict[str, float | str]] = []

    def mark(self, name: str) -> None:
        now = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                   if line.startswith("VmRSS:")) / 1024
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        self.marks.append({"phase": name, "peak_mib": round(peak, 1), "rss_mib": round(now, 1)})


def train_step(model, opt) -> None:
    """One update of the model on a short random sequence (the gradients and Adam's two moments appear)."""
    import torch

    ids = torch.randint(0, 1000, (1, 64), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def rank_main(side: str, model_dir: Path, out: Path, train: bool) -> None:
    """One trainer rank's model set-up (`side`: before | after), and with `train` one step and a checkpoint;
    writes its peak RSS and each phase's marks to out/<side>-<rank>.json."""
    import torch

    from agentrl.trainer import checkpoint
    from agentrl.trainer.checkpoint import TrainerState
    from agentrl.trainer.learner import stage_weights
    from agentrl.trainer.model_load import load_model, load_policy, load_reference
    from agentrl.trainer.parallel import Parallel, close_distributed, dist_env, init_distributed
    from agentrl.transport import weights as weights_io

    env = dist_env()
    device = init_distributed(env)
    ph = Phases()
    ph.mark("start")
    try:
        par = Parallel("fsdp2", env, device, mixed_precision="bf16")
        if side == "before":
            policy = par.wrap(load_model(model_dir, 1))
            ph.mark("policy")
            ref = par.wrap_frozen(load_model(model_dir, 1))
            ph.mark("reference")
            whole = par.full_state_dict(policy)
        else:
            policy = load_policy(model_dir, 1, par)
            ph.mark("policy")
            ref = load_reference(model_dir, 1, par)
            ph.mark("reference")
            whole = None
            staged = stage_weights(out / f"run-{side}", 1, policy, par, model_dir)  # as the trainer publishes
            if staged is not None:
                weights_io.publish_staged(staged)
        del whole
        ph.mark("publish")
        if train:
            opt = torch.optim.AdamW(policy.parameters(), lr=1e-6)
            train_step(policy, opt)
            ph.mark("step")
            checkpoint.save(out / f"run-{side}", TrainerState(step=1), policy, opt, None, par, keep=1)
            ph.mark("checkpoint")
        del ref, policy
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        (out / f"{side}-{env.rank}.json").write_text(json.dumps({"peak_rss_mib": peak_mib, "phases": ph.marks}))
    finally:
        close_distributed()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one(side: str, model_dir: Path, out: Path, ranks: int, train: bool) -> list[dict]:
    env = {**os.environ, "WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "jobs.bench_trainer_memory", "--rank-of", side, "--model", str(model_dir),
           "--work", str(out), *(["--train"] if train else [])]
    procs = [subprocess.Popen(cmd, env={**env, "RANK": str(r)})
             for r in range(ranks)]
    for p in procs:
        if p.wait(timeout=1800) != 0:
            raise RuntimeError(f"{side}: a rank exited with {p.returncode}")
    return [json.loads((out / f"{side}-{r}.json").read_text()) for r in range(ranks)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=24, help="Qwen2.5-0.5B has 24")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("runs/bench/trainer_memory"))
    ap.add_argument("--out", type=Path, default=Path("runs/bench/trainer_memory.json"))
    ap.add_argument("--train", action="store_true",
                    help="also one optimizer step and a checkpoint per side (phases 'step', 'checkpoint')")
    ap.add_argument("--sides", nargs="+", choices=["before", "after"], default=["before", "after"])
    ap.add_argument("--rank-of", choices=["before", "after"], help=argparse.SUPPRESS)
    ap.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_of:
        rank_main(args.rank_of, args.model, args.work, args.train)
        return
    args.work.mkdir(parents=True, exist_ok=True)
    model_dir = build(args.work / f"qwen2-shape-{args.layers}l", args.layers)
    runs: dict[str, list[list[dict]]] = {side: [] for side in args.sides}
    t0 = time.time()
    for _ in range(args.rounds):
        for side in args.sides:
            runs[side].append(one(side, model_dir, args.work, args.ranks, args.train))
            marks = [[(m["phase"], round(m["peak_mib"]), round(m["rss_mib"])) for m in x["phases"]]
                     for x in runs[side][-1]]
            print(f"{side}: peak RSS per rank {[round(x['peak_rss_mib']) for x in runs[side][-1]]} MiB; per rank "
                  f"(phase, peak so far, RSS now) {marks}", flush=True)
    summary = {}
    for side, rounds in runs.items():
        per_rank = list(zip(*rounds))
        summary[side] = {f"rank{r}": {"median_mib": statistics.median(x["peak_rss_mib"] for x in v),
                                      "min_mib": min(x["peak_rss_mib"] for x in v),
                                      "max_mib": max(x["peak_rss_mib"] for x in v),
                                      "phases_last_round": v[-1]["phases"]}
                         for r, v in enumerate(per_rank)}
    ratio = [summary["before"][f"rank{r}"]["median_mib"] / summary["after"][f"rank{r}"]["median_mib"]
             for r in range(args.ranks)] if len(summary) == 2 else None
    result = {"command": " ".join(sys.argv), "cpu": platform.processor() or platform.machine(),
              "cores": os.cpu_count(), "load_avg": os.getloadavg(), "layers": args.layers, "ranks": args.ranks,
              "rounds": args.rounds, "train": args.train, "seconds": time.time() - t0, "sides": summary,
              "before_over_after_per_rank": ratio}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    for r in range(args.ranks) if ratio else ():
        b, a = summary["before"][f"rank{r}"], summary["after"][f"rank{r}"]
        print(f"rank {r}: before {b['median_mib']:.0f} MiB ({b['min_mib']:.0f}-{b['max_mib']:.0f}), after "
              f"{a['median_mib']:.0f} MiB ({a['min_mib']:.0f}-{a['max_mib']:.0f}): {ratio[r]:.2f}x less")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
