"""The trainer role on a synchronous schedule: warm start, then for each step read the rollout's shard,
update, publish weights v<N+1>.

Trajectories arrive as HDF5 shards (`shards/rollout-0/<step>.h5`, one per step); weights leave as
versioned safetensors directories. Infrastructure outcomes (env_error, cancelled) are counted, never
trained on; agent failures get `fail_penalty`.
"""
from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from agentrl.algorithms.advantages import informative_groups
from agentrl.algorithms.staleness import fresh_mask, staleness
from agentrl.monitor.rollout_stats import rollout_metrics
from agentrl.trainer.batch import collate
from agentrl.trainer.step import RLHyper, rl_step, sft_step
from agentrl.transport import weights as weights_io
from agentrl.transport.shards import ShardReader
from agentrl.types import Trajectory

log = logging.getLogger("agentrl.trainer")


@dataclass(frozen=True)
class Schedule:
    steps: int
    sft_steps: int
    sft_batch: int
    sft_lr: float
    sft_all_tokens: bool
    lr: float
    weight_decay: float
    max_staleness: int
    drop_uniform_groups: bool
    fail_penalty: float
    wait_timeout_s: float
    seed: int
    poll_s: float = 0.05


def shaped_rewards(trajs: list[Trajectory], fail_penalty: float) -> list[float]:
    return [fail_penalty if t.status.is_agent_failure else float(t.reward) for t in trajs]


def load_model(model_dir: str | Path, threads: int) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)


def warm_start(model: torch.nn.Module, demos: list[Trajectory], s: Schedule, h: RLHyper, pad_id: int,
               monitor) -> dict[str, float]:
    """Supervised steps on the scripted expert's successful trajectories."""
    demos = [t for t in demos if t.metrics.get("success", 0.0) > 0]
    if not demos:
        raise RuntimeError("warm start: the expert produced no successful trajectory")
    opt = torch.optim.AdamW(model.parameters(), lr=s.sft_lr, weight_decay=0.0)
    # short linear warm-up, then linear decay to 0
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / 10) * (1.0 - i / max(s.sft_steps, 1)))
    rng = random.Random(s.seed)
    stats: dict[str, float] = {}
    for i in range(s.sft_steps):
        picked = rng.sample(demos, min(s.sft_batch, len(demos)))
        batch = collate(picked, [0.0] * len(picked), pad_id)
        stats = sft_step(model, opt, batch, h.grad_clip, h.micro_batch_tokens, s.sft_all_tokens)
        sched.step()
        monitor.scalars({f"sft/{k}": v for k, v in stats.items()}, i)
        if i % 50 == 0 or i == s.sft_steps - 1:
            log.info("sft step %d/%d loss %.4f token_acc %.3f", i + 1, s.sft_steps, stats["sft_loss"],
                     stats["sft_token_acc"])
    return stats


def run(run_dir: Path, model_dir: Path, s: Schedule, h: RLHyper, threads: int, monitor) -> None:
    model = load_model(model_dir, threads)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)  # padding is masked
    if s.sft_steps > 0:
        demos = ShardReader(run_dir / "shards" / "expert-0").wait(0, timeout_s=s.wait_timeout_s, poll_s=s.poll_s)
        log.info("warm start on %d expert trajectories", len(demos))
        warm_start(model, demos, s, h, pad_id, monitor)
    weights_io.publish(run_dir, 0, model.state_dict())
    log.info("published weights v0")

    ref_model = None
    if h.kl_coef > 0:
        ref_model = load_model(model_dir, threads)
        ref_model.load_state_dict(model.state_dict())
        ref_model.eval().requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=s.weight_decay)
    reader = ShardReader(run_dir / "shards" / "rollout-0")
    for step in range(s.steps):
        t_wait = time.perf_counter()
        trajs = reader.wait(step, timeout_s=s.wait_timeout_s, poll_s=s.poll_s)
        t0 = time.perf_counter()
        usable, rewards, counts = select_training_data(trajs, step, s)
        stats: dict[str, float] = {}
        if usable:
            batch = collate(usable, rewards, pad_id)
            model.train()
            stats = rl_step(model, opt, batch, h, ref_model)
        weights_io.publish(run_dir, step + 1, model.state_dict())
        dt = time.perf_counter() - t0
        n_tok = sum(t.num_tokens for t in usable)
        metrics = {f"train/{k}": v for k, v in stats.items()}
        metrics.update(rollout_metrics(trajs))
        metrics.update({"train/lr": opt.param_groups[0]["lr"], "pipeline/batch_size": float(len(usable)),
                        "pipeline/trainer_wait_s": t0 - t_wait, "pipeline/train_tokens_per_s": n_tok / max(dt, 1e-9)})
        metrics.update({f"pipeline/{k}": float(v) for k, v in counts.items()})
        monitor.scalars(metrics, step)
        log.info("step %d/%d trained on %d of %d (%d in uniform groups) loss %.4f approx_kl %.4f grad_norm %.3f "
                 "(%.1fs)", step + 1, s.steps, len(usable), len(trajs), counts["dropped_uniform"],
                 stats.get("loss", 0.0), stats.get("approx_kl", 0.0), stats.get("grad_norm", 0.0), dt)


def select_training_data(trajs: list[Trajectory], version: int, s: Schedule
                         ) -> tuple[list[Trajectory], list[float], dict[str, float]]:
    """What one step trains on, and why the rest was left out (every exclusion is counted).

    Infrastructure outcomes are never trained on; trajectories more than `max_staleness` versions old
    are dropped; groups whose (shaped) rewards are all equal carry no GRPO signal and are dropped
    before task normalization could turn their zero advantages into a bias (see `informative_groups`).
    """
    usable = [t for t in trajs if not t.status.is_infra]
    counts = {"dropped_infra": len(trajs) - len(usable), "dropped_stale": 0, "dropped_uniform": 0,
              "staleness_max": 0}
    if usable:
        stale = staleness_of(torch.tensor([t.oldest_version() for t in usable]), version)
        keep = fresh_mask(stale, s.max_staleness).tolist()
        counts["dropped_stale"] = keep.count(False)
        counts["staleness_max"] = int(stale.max())
        usable = [t for t, k in zip(usable, keep) if k]
    rewards = shaped_rewards(usable, s.fail_penalty)
    if usable and s.drop_uniform_groups:
        ids = {g: i for i, g in enumerate(dict.fromkeys(t.group_id for t in usable))}
        keep = informative_groups(torch.tensor(rewards), torch.tensor([ids[t.group_id] for t in usable])).tolist()
        counts["dropped_uniform"] = keep.count(False)
        usable = [t for t, k in zip(usable, keep) if k]
        rewards = [r for r, k in zip(rewards, keep) if k]
    return usable, rewards, counts


def staleness_of(oldest_version: torch.Tensor, current: int) -> torch.Tensor:
    """Staleness of trajectories given their oldest action-token version (one column per trajectory)."""
    mask = (oldest_version >= 0).long()[:, None]
    return staleness(oldest_version[:, None].clamp(min=0), mask, current)
