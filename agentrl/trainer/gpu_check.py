"""The check a site runs first on a GPU machine: FSDP2 in bf16, NCCL, and the project's own RL step at a model's size.

What it is: a Qwen2-shaped model with random weights (`--shape`: Qwen2.5-0.5B's by default, or 1.5b, 3b, 7b, 14b,
32b, or any config.json) trained by `agentrl.trainer.step.rl_step` on synthetic multi-turn trajectories, sharded
with FSDP2 (`Parallel`, fully_shard per decoder layer, bf16 compute, float32 reduction), with the attention and
activation checkpointing a run would use. Its steps alternate with the bare step's (`trainer.bare`, the least a
trainer does on the same micro-batches) on the same model, so `ours_over_bare` is our overhead. It reports what a
person needs before booking a cluster: tokens per second, model FLOPs utilisation against the GPU's dense bf16
peak (counting the FLOPs the step must do: the head only at the positions it runs on, no recomputation), the
memory model's figure for each component (`trainer.memory`) beside the measured ones, and whether NCCL came up.
Entry point: `python -m jobs.gpu_check` (or `torchrun --nproc-per-node N -m jobs.gpu_check`).

What it is not: a benchmark of the rollout (it needs no vLLM), nor a convergence test (random weights,
random tokens). On one rank it still shards: `Parallel` leaves a single rank unsharded (there is nothing
to shard across), so the check runs a one-rank process group and forces the sharded path, which then
exercises fully_shard, the mixed-precision policy and DTensor gradient clipping exactly as N ranks do.

Needs torch, transformers and safetensors only (safetensors comes with transformers).
"""
from __future__ import annotations

import math
import resource
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from agentrl.config import AlgoConfig, TrainerConfig
from agentrl.trainer import attention, memory
from agentrl.trainer.bare import bare_batches, bare_step
from agentrl.trainer.batch import TrainBatch, collate, plan_micro_batches
from agentrl.trainer.head import TILE_ELEMENTS
from agentrl.trainer.memory import GIB, SHAPES, Setup, Shape
from agentrl.trainer.model_load import checkpoint_activations
from agentrl.trainer.parallel import DistEnv, Parallel
from agentrl.trainer.step import advantages, rl_step
from agentrl.types import Status, Trajectory, TrajectoryBuilder

# Dense (no sparsity) bf16 tensor-core peaks in FLOP/s, from the vendors' data sheets; matched as substrings
# of torch.cuda.get_device_name(), first match wins (the more specific names come first).
BF16_PEAK_FLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("GH200", 989e12),
    ("H200", 989e12),
    ("H100", 989e12),   # SXM ("H100 80GB HBM3")
    ("H800", 989e12),
    ("H20", 148e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("A10G", 70e12),
    ("L4", 121e12),
    ("MI300X", 1307e12),
)


def bf16_peak(device_name: str) -> float | None:
    """The dense bf16 peak of a device by its name, or None when it is not in the table."""
    for key, peak in BF16_PEAK_FLOPS:
        if key in device_name:
            return peak
    return None


TINY = Shape(hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128, vocab=512, tied=True)


@dataclass(frozen=True)
class CheckConfig:
    shape: Shape = field(default_factory=lambda: SHAPES["0.5b"])
    shape_name: str = "0.5b"
    trajectories: int = 64
    group: int = 8
    min_len: int = 512
    max_len: int = 2048
    micro_batch_tokens: int = 16384
    attn: str = "auto"
    checkpointing: bool = False
    steps: int = 2
    """Timed steps of each side per round."""
    repeats: int = 3
    """Rounds, ours then bare in each."""
    warmup: int = 1
    seed: int = 0


TINY_CHECK = CheckConfig(shape=TINY, shape_name="tiny", trajectories=8, group=4, min_len=24, max_len=96,
                         micro_batch_tokens=256, steps=1, repeats=2, warmup=1)


def shape_of(name: str) -> Shape:
    """A named Qwen2.5 shape (`memory.SHAPES`), `tiny`, or a Hugging Face config.json's."""
    if name == "tiny":
        return TINY
    if name in SHAPES:
        return SHAPES[name]
    if Path(name).is_file():
        return Shape.from_config(name)
    raise ValueError(f"--shape {name!r}: one of {['tiny', *SHAPES]} or a config.json")


def train_flops(shape: Shape, lengths: list[int], head_rows: int) -> float:
    """The FLOPs one forward + backward must do over sequences of `lengths` tokens with the head at `head_rows`
    positions (what MFU counts: no recomputation, the head only where it runs).

    6 per token and weight of the decoder's matrix multiplies; 6·V·D per head position; causal attention, per layer
    and sequence of length S, 2·S²·q for the scores and 2·S²·q for the weighted values (q = heads × head_dim),
    halved by the causal mask and tripled for forward + backward: 6·q·S² (PaLM's accounting, appendix B, with the
    causal half). Packed sequences attend within themselves only, so S is each one's."""
    decoder = shape.layers * (shape.layer_params() - 2 * shape.hidden)  # the norms' weights multiply no matrix
    q = shape.heads * shape.d
    return float(sum(6 * decoder * s + 6 * shape.layers * q * s * s for s in lengths)
                 + 6 * shape.vocab * shape.hidden * head_rows)


def synthetic_trajectories(n: int, group: int, min_len: int, max_len: int, vocab: int, seed: int) -> list[Trajectory]:
    """Multi-turn trajectories (alternating observation and action segments, about half the tokens actions,
    behaviour log-probs in [-3, 0]); rewards 0/1 within GRPO groups of `group`. Every rank draws the same."""
    rng = np.random.default_rng(seed)
    out = []
    for j in range(n):
        target = int(rng.integers(min_len, max_len + 1))
        b = TrajectoryBuilder()
        while len(b) < target:
            b.add_context(rng.integers(0, vocab, int(min(rng.integers(8, 64), target - len(b)))).tolist())
            act = int(min(rng.integers(8, 64), target - len(b)))
            if act > 0:
                b.add_action(rng.integers(0, vocab, act).tolist(), (-rng.random(act) * 3).tolist(), 0, 0)
        out.append(b.build(traj_id=str(j), task="check", index=str(j // group), group_id=str(j // group),
                           reward=float(rng.integers(0, 2)), status=Status.COMPLETED, num_turns=1))
    return out


class ShardedAlone(Parallel):
    """`Parallel` with FSDP2 on a one-rank process group (see the module docstring)."""

    @property
    def sharded(self) -> bool:
        return self.kind == "fsdp2"


def start_process_group(env: DistEnv, device: torch.device) -> None:
    """A one-rank group (an in-memory store, no port) when the launcher started one rank; `init_distributed`
    has made the group already when it started more."""
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                                world_size=1)


def nccl_status(device: torch.device) -> dict[str, Any]:
    """Whether the group's NCCL communicator works: one all-reduce of ones must sum to the world size
    (NCCL makes its communicator lazily, at the first collective)."""
    if dist.get_backend() != "nccl":
        return {"nccl": "not used", "backend": dist.get_backend()}
    try:
        x = torch.ones(1, device=device)
        dist.all_reduce(x)
        torch.cuda.synchronize(device)
        ok = int(x.item()) == dist.get_world_size()
        version = ".".join(str(v) for v in torch.cuda.nccl.version())
        return {"nccl": "initialised" if ok else f"all_reduce gave {x.item()}", "nccl_version": version,
                "backend": "nccl"}
    except Exception as e:  # the report says what failed instead of a traceback on every rank
        return {"nccl": f"failed: {type(e).__name__}: {e}", "backend": "nccl"}


def build_model(shape: Shape, device: torch.device, seed: int, max_len: int = 4096) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)  # every rank builds the same weights before sharding
    cfg = Qwen2Config(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                      num_hidden_layers=shape.layers, num_attention_heads=shape.heads, head_dim=shape.d,
                      num_key_value_heads=shape.kv_heads, max_position_embeddings=max_len,
                      tie_word_embeddings=shape.tied)
    with torch.device(device):  # random init straight on the GPU: seconds instead of a minute on the CPU
        return Qwen2ForCausalLM(cfg)


def _local_bytes(ts) -> float:
    return float(sum((t.to_local() if hasattr(t, "to_local") else t).nbytes for t in ts if t is not None))


def _state_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer | None) -> float:
    """This rank's parameters, gradients and optimizer state, counted tensor by tensor."""
    params = list(model.parameters())
    total = _local_bytes(params) + _local_bytes(p.grad for p in params)
    if opt is not None:
        total += _local_bytes(v for st in opt.state.values() for v in st.values() if torch.is_tensor(v))
    return total


def _profiled_peak(fn) -> float | None:
    """The most bytes of live CPU tensors during `fn` (torch.profiler's memory timeline: parameters, gradients,
    optimizer state, activations and temporaries), or None where this torch's profiler cannot say."""
    from torch.profiler import ProfilerActivity, profile

    try:
        from torch.profiler._memory_profiler import MemoryProfileTimeline

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                     with_stack=True) as prof:
            fn()
        _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
        return float(max(sum(x) for x in sizes))
    except Exception:  # a private API: a report without the figure beats no report
        return None


def _timed(fn, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t


def _kv_repeated(impl: str, device: torch.device) -> bool:
    import inspect

    fn = attention.torch_varlen()
    return impl == "varlen" and device.type == "cuda" and fn is not None and \
        "enable_gqa" not in inspect.signature(fn).parameters


@torch.no_grad()
def logprob_agreement(model: torch.nn.Module, batch: TrainBatch, device: torch.device) -> dict[str, float]:
    """The log-probs of the first two trajectories packed into one row, through the tiled head and the model's
    attention, against the old path on each alone: SDPA with the padding mask and the whole float32
    log-softmax. Collective under FSDP2 (every rank runs it)."""
    from agentrl.trainer.batch import layout
    from agentrl.trainer.logprobs import full_vocab_logprobs, head_outputs

    idx = [0, 1]
    width = max(batch.lengths[i] for i in idx)
    ref = torch.zeros_like(batch.behaviour_logp)
    ref[idx, : width - 1] = full_vocab_logprobs(model, batch.tokens[idx, :width].to(device),
                                                batch.attention[idx, :width].to(device))[0].cpu()
    mb = layout(batch, [idx], {"ref": ref, "mask": batch.mask}, packing=True).to(device)
    logp = mb.grid(head_outputs(model, mb, 1.0, "none")[0])
    on = mb.targets["mask"] > 0
    diff = (logp - mb.targets["ref"])[on].abs()
    return {"max_abs": float(diff.max()), "mean_abs": float(diff.mean()), "positions": int(on.sum())}


def run_check(check: CheckConfig, env: DistEnv, device: torch.device) -> dict[str, Any]:
    """Warm up, then `check.repeats` rounds of `check.steps` timed steps of ours and of the bare step on one model;
    return the report (the same on every rank except the memory figures, which are this rank's). The process group
    must exist (see `start_process_group`)."""
    par_cls = ShardedAlone if env.world_size == 1 else Parallel
    par = par_cls("fsdp2", env, device, "bf16")
    nccl = nccl_status(device)
    s, cuda = check.shape, device.type == "cuda"
    t0 = time.perf_counter()
    model = build_model(s, device, check.seed, max(4096, check.max_len))
    impl = attention.apply(model, check.attn, device)
    if check.checkpointing:
        checkpoint_activations(model)
    n_params = sum(p.numel() for p in model.parameters())
    model = par.wrap(model)
    if cuda:  # from here on, torch.cuda's allocated bytes are this check's
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    params_b = float(torch.cuda.memory_allocated(device)) if cuda else _state_bytes(model, None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    trajs = synthetic_trajectories(check.trajectories, check.group, check.min_len, check.max_len, s.vocab, check.seed)
    batch: TrainBatch = collate(trajs, [t.reward for t in trajs], pad_id=0)
    algo, trainer = AlgoConfig(kl_coef=0.0), TrainerConfig(micro_batch_tokens=check.micro_batch_tokens, packing=True)
    bbs = bare_batches(batch, advantages(batch, algo), trainer.micro_batch_tokens, trainer.packing, impl, par)
    head_rows = max(int(b.mb.select.numel()) for b in bbs)
    setup_s = time.perf_counter() - t0
    stats: dict[str, float] = {}

    def ours() -> None:
        stats.update(rl_step(model, opt, batch, algo, trainer, 1.0, None, par))

    def bare() -> None:
        bare_step(model, opt, bbs, batch.num_action_tokens, trainer.grad_clip, "lean", par)

    ours()  # the first step allocates the gradients and AdamW's moments
    state_b = float(torch.cuda.memory_allocated(device)) if cuda else _state_bytes(model, opt)
    for _ in range(max(0, check.warmup - 1)):
        ours()
    for _ in range(check.warmup):
        bare()
    times: dict[str, list[list[float]]] = {"ours": [], "bare": []}
    peaks: dict[str, float | None] = {}
    for _ in range(check.repeats):
        for name, fn in (("ours", ours), ("bare", bare)):
            if cuda:
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
            times[name].append([_timed(fn, device) for _ in range(check.steps)])
            if cuda:
                peaks[name] = max(peaks.get(name) or 0.0, float(torch.cuda.max_memory_allocated(device)))
    if not cuda:  # one more step of each, untimed, under the profiler's memory timeline
        peaks = {"ours": _profiled_peak(ours), "bare": _profiled_peak(bare)}
    agreement = logprob_agreement(model, batch, device)  # after the peaks: the old path's tensors are large
    tokens = sum(batch.lengths)
    flops = train_flops(s, list(batch.lengths), batch.num_action_tokens)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = bf16_peak(name) if device.type == "cuda" else None
    W = env.world_size

    def side(rounds: list[list[float]]) -> dict[str, Any]:
        med = statistics.median(t for r in rounds for t in r)
        return {"step_s": rounds, "step_s_median": med, "tokens_per_s": tokens / med,
                "achieved_tflops_per_rank": flops / med / W / 1e12, "mfu": flops / med / (peak * W) if peak else None}

    o, b = side(times["ours"]), side(times["bare"])
    ratios = [statistics.median(rb) / statistics.median(ro) for ro, rb in zip(times["ours"], times["bare"])]
    rows = plan_micro_batches(batch.lengths, check.micro_batch_tokens, True)
    u = Setup(ranks=W, sharded=True, compute_bytes=2, micro_batch_tokens=check.micro_batch_tokens,
              head_rows=head_rows, row_len=max(batch.lengths), attention=impl, kv_repeat=_kv_repeated(impl, device),
              checkpointing=check.checkpointing, reference=False,
              tile_elements=TILE_ELEMENTS.get(device.type, TILE_ELEMENTS["cuda"]))
    est = memory.estimate(s, u)
    c = est.components
    modelled = {"params": c["params"], "params_grads_optimizer": c["params"] + c["grads"] + c["optimizer"],
                "step_peak": est.peak}
    measured = {"params": params_b, "params_grads_optimizer": state_b, "step_peak": peaks["ours"]}
    report: dict[str, Any] = {
        "device": name, "world_size": W, "shape": check.shape_name, "params": n_params, "attention": impl,
        "activation_checkpointing": check.checkpointing, "micro_batch_tokens": check.micro_batch_tokens,
        "tokens_per_step": tokens, "head_positions_per_step": batch.num_action_tokens, "micro_batches": len(rows),
        **{k: o[k] for k in ("step_s", "step_s_median", "tokens_per_s", "achieved_tflops_per_rank", "mfu")},
        "tokens_per_s_per_rank": o["tokens_per_s"] / W, "bare": b, "ours_over_bare": statistics.median(ratios),
        "ours_over_bare_rounds": ratios, "model_tflops_per_step": flops / 1e12,
        "bf16_peak_tflops": peak / 1e12 if peak else None,
        "memory": {"measured_gib": {k: None if v is None else v / GIB for k, v in measured.items()},
                   "modelled_gib": {k: v / GIB for k, v in modelled.items()},
                   "components_gib": {k: v / GIB for k, v in {**c, "peak": est.peak}.items()},
                   "bare_step_peak_gib": None if peaks["bare"] is None else peaks["bare"] / GIB,
                   "peak_old_head_gib": est.peak_old_head / GIB,
                   "measured_as": "torch.cuda.max_memory_allocated" if cuda else
                   "live tensors (state counted; peak: torch.profiler's memory timeline)"},
        "logprob_agreement": agreement,
        "loss": stats["loss"], "grad_norm": stats["grad_norm"], "finite": math.isfinite(stats["loss"])
        and math.isfinite(stats["grad_norm"]), "setup_s": setup_s, "torch": torch.__version__, **nccl,
        "host_peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }
    if cuda:
        report["gpu_peak_reserved_gib"] = torch.cuda.max_memory_reserved(device) / GIB
        report["gpu_total_gib"] = torch.cuda.get_device_properties(device).total_memory / GIB
    return report


def summary(r: dict[str, Any]) -> str:
    """The report as the few lines a person reads."""
    def mfu(x: float | None) -> str:
        return f"MFU {100 * x:.1f}%" if x is not None else f"MFU unknown (no bf16 peak known for {r['device']!r})"

    m, a = r["memory"], r["logprob_agreement"]
    unit, scale = ("GiB", 1.0) if m["modelled_gib"]["step_peak"] >= 1 else ("MiB", 1024.0)

    def amount(x: float | None) -> str:
        return "?" if x is None else f"{x * scale:.2f}"

    mem = "; ".join(f"{k.replace('_', ' ')} {amount(m['modelled_gib'][k])} | {amount(m['measured_gib'][k])}"
                    for k in m["modelled_gib"])
    comps = ", ".join(f"{k} {amount(v)}" for k, v in m["components_gib"].items() if k != "peak")
    rounds = r["ours_over_bare_rounds"]
    return "\n".join([
        f"device {r['device']} x {r['world_size']}, torch {r['torch']}, shape {r['shape']} ({r['params'] / 1e6:.0f}M "
        f"parameters, FSDP2, bf16), attention {r['attention']}, activation checkpointing "
        f"{'on' if r['activation_checkpointing'] else 'off'}; {r['tokens_per_step']} tokens per step "
        f"({r['head_positions_per_step']} through the head) in {r['micro_batches']} micro-batches of <= "
        f"{r['micro_batch_tokens']}",
        f"ours: step {r['step_s_median']:.3f} s (median), {r['tokens_per_s']:,.0f} tokens/s "
        f"({r['tokens_per_s_per_rank']:,.0f} per rank), {r['achieved_tflops_per_rank']:.1f} TFLOP/s per rank, "
        f"{mfu(r['mfu'])} of {r['model_tflops_per_step']:.1f} TFLOP the step must do",
        f"bare: step {r['bare']['step_s_median']:.3f} s, {mfu(r['bare']['mfu'])}; ours/bare {r['ours_over_bare']:.3f} "
        f"({min(rounds):.3f}-{max(rounds):.3f} over {len(rounds)} rounds)",
        f"memory {unit} per rank, modelled | measured ({m['measured_as']}): {mem}",
        f"  modelled components: {comps}; with the old whole-vocabulary head the peak would be "
        f"{amount(m['peak_old_head_gib'])}",
        f"log-probs of 2 packed trajectories ({r['attention']}, tiled head) against each alone through SDPA and the "
        f"whole float32 log-softmax: max |diff| {a['max_abs']:.2e}, mean {a['mean_abs']:.2e} over {a['positions']}",
        f"nccl: {r['nccl']}" + (f" (NCCL {r['nccl_version']})" if "nccl_version" in r else f" ({r['backend']})"),
        f"loss {r['loss']:.4f}, grad norm {r['grad_norm']:.3f}, finite: {r['finite']}; set-up {r['setup_s']:.1f} s",
    ])


def with_preset(check: CheckConfig, cfg) -> CheckConfig:
    """`check` with a run config's trainer settings: micro-batch tokens, activation checkpointing, attention."""
    t = cfg.trainer
    return replace(check, micro_batch_tokens=t.micro_batch_tokens, checkpointing=t.activation_checkpointing,
                   attn=t.attn_implementation)
