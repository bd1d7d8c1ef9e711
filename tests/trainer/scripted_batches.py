"""The scripted rollout's batches for the trainer tests (imported by name, as `system_tools`): one step's GRPO
groups as sampled by v<step>, with rewards that differ within each group, and a one-thread context for
bit-equal float reductions between a role and its by-hand reference."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from agentrl.config import RunConfig, load_config
from agentrl.models import tiny
from agentrl.trainer.batch import collate
from agentrl.trainer.model_load import load_model, set_threads
from agentrl.trainer.select import shaped_rewards
from agentrl.trainer.step import rl_step
from agentrl.types import Status, Trajectory, TrajectoryBuilder

STEPS = 4


def scripted_model(out: Path) -> Path:
    """The small model the scripted batches' token ids fit (vocabulary 300)."""
    corpus = [f"call lookup {i} then answer {i * 7}" for i in range(50)]
    tok = tiny.train_tokenizer(corpus, 300, ["<|end|>", "<|pad|>"], "{{ messages }}", "<|end|>", "<|pad|>")
    return tiny.save(tiny.build_model(tok, 32, 2, 2, 64, 256, seed=3), tok, out)


def step_batch(step: int, n_groups: int = 2, vocab: int = 250) -> list[Trajectory]:
    """One step's rollout, sampled by weights v<step> (a synchronous schedule); rewards differ within groups."""
    rng = np.random.default_rng(100 + step)
    out = []
    for g in range(n_groups):
        for k in range(4):
            b = TrajectoryBuilder()
            for _ in range(int(rng.integers(1, 3))):
                b.add_context(rng.integers(5, vocab, int(rng.integers(3, 8))).tolist())
                n = int(rng.integers(2, 6))
                b.add_action(rng.integers(5, vocab, n).tolist(), (-rng.random(n) * 2 - 3).tolist(), step, 0)
            status = Status.TURN_LIMIT if k == 3 else Status.COMPLETED
            out.append(b.build(traj_id=f"s{step}-g{g}-{k}", task="lookup", index=str(g), group_id=f"s{step}-{g}",
                               reward=float(k % 2), status=status, num_turns=2, metrics={"success": 1.0}))
    return out


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Every run here computes on one thread (as the trainer processes do): bit-equal float reductions."""
    threads = torch.get_num_threads()
    set_threads(1)  # not torch.set_num_threads: an earlier in-process vLLM engine here made it a no-op
    try:
        yield
    finally:
        set_threads(threads)


def settings_of(run_dir: Path) -> RunConfig:
    return load_config(str(run_dir / "config.yaml"))


def by_hand(model_dir: Path, cfg: RunConfig) -> dict[str, torch.Tensor]:
    """The synchronous trainer by hand: each step's whole batch, one rl_step, warm-up lr."""
    t = cfg.trainer
    with one_thread():
        model = load_model(model_dir, 1)
        opt = torch.optim.AdamW(model.parameters(), lr=t.lr, weight_decay=t.weight_decay)
        for step in range(STEPS):
            for g in opt.param_groups:
                g["lr"] = t.lr * min(1.0, (step + 1) / t.warmup_steps)
            trajs = step_batch(step)
            rl_step(model, opt, collate(trajs, shaped_rewards(trajs, cfg.algo.fail_penalty), pad_id=1), cfg.algo, t,
                    cfg.rollout.temperature)
    return model.state_dict()
