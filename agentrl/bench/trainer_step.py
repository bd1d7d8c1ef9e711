"""One train step through our trainer (`rl_step`) against a bare PyTorch forward/backward/step on the same
packed micro-batches of the same model, in the same process (`jobs.bench_trainer` is the command line and
says what each side does).

After warm-up the two sides alternate through `agentrl.bench.repeat` (ours, bare, ours, bare, ...: `repeats`
rounds of `steps` timed steps each), so that load from other processes falls on both alike; each round's
tokens/s is that side's median step's, the ratio is taken within each round, and the report gives the median and
min-max over the rounds, with the ratio of the fastest steps beside it.
"""
from __future__ import annotations

import copy
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from agentrl.bench.repeat import Ratio, interleave, summarize
from agentrl.config import AlgoConfig, TrainerConfig
from agentrl.trainer import attention
from agentrl.trainer.bare import bare_batches, bare_step
from agentrl.trainer.batch import collate, padding_fraction, plan_micro_batches
from agentrl.trainer.gpu_check import synthetic_trajectories
from agentrl.trainer.parallel import Parallel
from agentrl.trainer.step import advantages, rl_step


@dataclass(frozen=True)
class StepBench:
    """The model, the batch and the timing of one comparison."""

    hidden: int = 256
    layers: int = 4
    heads: int = 4
    vocab: int = 8192
    trajectories: int = 32
    group: int = 8
    min_len: int = 64
    max_len: int = 512
    micro_batch_tokens: int = 2048
    packing: bool = True
    kl_coef: float = 0.0
    """> 0 adds the frozen reference's forward pass to ours (the bare step has none)."""
    steps: int = 5
    """Timed steps of each side per repeat."""
    repeats: int = 3
    """Rounds of `steps` steps per side, interleaved (ours, bare, ours, bare, ...)."""
    warmup: int = 1
    device: str = "cpu"
    mixed_precision: str = "fp32"
    attn_implementation: str = "auto"
    bare_head: str = "lean"
    """The bare step's head: lean (the tiled head on action tokens, as ours) | full (every position's float32
    log-softmax: the trainer's old head)."""
    seed: int = 0


def make_model(hidden: int, layers: int, heads: int, vocab: int, max_len: int, seed: int) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=max_len,
                      tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg)


def compare_steps(s: StepBench) -> dict[str, Any]:
    """Time our step and the bare one on the same batch; tokens/s of each, their ratio and the batch's layout."""
    device = torch.device(s.device)
    trajs = synthetic_trajectories(s.trajectories, s.group, s.min_len, s.max_len, s.vocab, s.seed)
    batch = collate(trajs, [t.reward for t in trajs], pad_id=0)
    algo, trainer = AlgoConfig(kl_coef=s.kl_coef), TrainerConfig(micro_batch_tokens=s.micro_batch_tokens,
                                                                  packing=s.packing)
    par = Parallel(device=device, mixed_precision=s.mixed_precision)
    base = make_model(s.hidden, s.layers, s.heads, s.vocab, s.max_len, s.seed)
    impl = attention.apply(base, s.attn_implementation, device, par.dtype)
    ours_model, bare_model = par.wrap(copy.deepcopy(base)), copy.deepcopy(base).to(device)
    ref = par.wrap_frozen(copy.deepcopy(base)) if s.kl_coef > 0 else None
    ours_opt = torch.optim.AdamW(ours_model.parameters(), lr=1e-5)
    bare_opt = torch.optim.AdamW(bare_model.parameters(), lr=1e-5)

    # the bare step's inputs, laid out once (outside its timing): the same micro-batch rows and packing as ours
    rows = plan_micro_batches(batch.lengths, trainer.micro_batch_tokens, trainer.packing)
    bbs = bare_batches(batch, advantages(batch, algo), trainer.micro_batch_tokens, trainer.packing, impl, par)
    tokens = sum(batch.lengths)

    def timed(fn: Callable[[], None]) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    def ours() -> None:
        rl_step(ours_model, ours_opt, batch, algo, trainer, 1.0, ref, par)

    def bare() -> None:
        with par.autocast():
            bare_step(bare_model, bare_opt, bbs, batch.num_action_tokens, trainer.grad_clip, s.bare_head, par)

    for _ in range(s.warmup):
        ours()
        bare()
    steps_s: dict[str, list[float]] = {"ours": [], "bare": []}

    def side(name: str, fn: Callable[[], None]) -> Callable[[int], dict[str, float]]:
        def one_round(_: int) -> dict[str, float]:
            t = [timed(fn) for _ in range(s.steps)]
            steps_s[name] += t
            return {"tokens_per_s": tokens / statistics.median(t), "best_step_s": min(t)}
        return one_round

    summary = summarize(interleave({"ours": side("ours", ours), "bare": side("bare", bare)}, s.repeats),
                        [Ratio("ours_over_bare", "ours", "tokens_per_s", "bare", "tokens_per_s")])
    t_ours, t_bare = steps_s["ours"], steps_s["bare"]
    ratio = summary["ratios"]["ours_over_bare"]["median"]
    return {
        "ours_tokens_per_s": summary["sides"]["ours"]["tokens_per_s"]["median"],
        "bare_tokens_per_s": summary["sides"]["bare"]["tokens_per_s"]["median"], "ratio": ratio,
        "overhead": 1.0 - ratio, "repeats": summary,
        # on a shared machine the fastest step is the least disturbed one: its ratio is the steadier figure
        "ratio_best_step": min(t_bare) / min(t_ours), "ours_step_s": t_ours, "bare_step_s": t_bare,
        "tokens_per_step": tokens, "action_tokens_per_step": batch.num_action_tokens,
        "micro_batches": len(rows), "padding_frac": padding_fraction(rows, batch.lengths),
        "padding_frac_padded_layout": padding_fraction(plan_micro_batches(batch.lengths, trainer.micro_batch_tokens,
                                                                          False), batch.lengths),
        "attention": impl, "bare_head": s.bare_head,
        "device": str(device), "torch": torch.__version__, "threads": torch.get_num_threads(),
        "host": platform.node(), "params": sum(p.numel() for p in base.parameters()),
    }
