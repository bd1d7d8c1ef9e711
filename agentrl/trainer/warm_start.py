"""The warm start: supervised steps on the scripted expert's trajectories before RL (docs/architecture.md §7).

Every trainer rank runs it alike (the same draws; each rank takes its share of each batch). It also serves
the control run (`trainer.update=warm_start`), whose RL steps are replaced by more of these steps.
"""
from __future__ import annotations

import logging
import random
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from agentrl.config import TrainerConfig
from agentrl.monitor.progress import StepProgress
from agentrl.trainer.batch import collate
from agentrl.trainer.checkpoint import WARM_FILE
from agentrl.trainer.imitation import reproduced_share
from agentrl.trainer.loss_watch import DemoFit, check_end, check_step, demo_fit
from agentrl.trainer.lr_range import auto_rates
from agentrl.trainer.parallel import Parallel
from agentrl.trainer.step import warm_start_step
from agentrl.types import Trajectory

log = logging.getLogger("agentrl.trainer")
__all__ = ["WARM_FILE", "DemoFit", "WarmStart", "check_control_run", "no_demos_message", "split_demos"]


def check_control_run(t: TrainerConfig, resume: Path | None) -> None:
    """The control run (`trainer.update=warm_start`) continues the warm start's own optimizer, schedule and draws: it
    needs a warm start, and resumes only from a checkpoint that holds that state (`WARM_FILE`: the warm start's
    own step-0 checkpoint, or any of a control run's). Resumed from another, it would silently train RL."""
    if t.update == "warm_start" and t.warm_start_steps == 0:
        raise ValueError("trainer.update=warm_start (the control run) continues a warm start: it needs "
                         "warm_start_steps > 0")
    if t.update == "warm_start" and resume is not None and not (resume / WARM_FILE).is_file():
        raise ValueError(f"trainer.update=warm_start (the control run) continues a warm start, but the checkpoint "
                         f"{resume} holds no warm-start state ({WARM_FILE}): it was written by an RL step. Start the "
                         "control in a fresh run dir (trainer.warm_start_from=<the RL run's dir> shares that run's "
                         "warm start)")


def split_demos(demos: list[Trajectory], t: TrainerConfig, seed: int) -> tuple[list[Trajectory], list[Trajectory]]:
    """(what the warm start trains on, held-out successful demonstrations per task for `warm_start_target`)."""
    rng = random.Random(seed + 1)
    held: list[Trajectory] = []
    if t.warm_start_target > 0:
        for task in sorted({d.task for d in demos}):
            wins = [d for d in demos if d.task == task and d.metrics.get("success", 0.0) > 0]
            held += rng.sample(wins, min(t.warm_start_holdout, len(wins) // 4))
    ids = {d.traj_id for d in held}
    train = [d for d in demos if d.traj_id not in ids]
    if t.warm_start_successful_only:
        train = [d for d in train if d.metrics.get("success", 0.0) > 0]
    return train, held


# What each ending of every demonstration most likely means, and where to look.
_WHY = {
    "context_limit": "the conversations outgrew rollout.max_model_len (python -m jobs.check_model prints each task's "
                     "first prompt in the model's chat format)",
    "turn_limit": "the expert's calls did not come back through the model's format: check the chat template and "
                  "parser with python -m jobs.check_model and the run's model.* settings",
    "invalid_action": "the task refused the expert's calls as the model's format wrote them (python -m "
                      "jobs.check_model)",
    "truncated": "rollout.max_turns ended them before the task did",
    "env_error": "the env workers failed (logs/env_worker-*.log)",
}


def no_demos_message(demos: list[Trajectory], t: TrainerConfig) -> str:
    """Why the warm start has nothing to train on: how every demonstration ended, per task, and what that means."""
    if not demos:
        return "warm start: the expert wrote no demonstrations (rollout.expert_samples, envs.tasks)"
    ends = Counter((d.task, d.status.value) for d in demos)
    wins = sum(d.metrics.get("success", 0.0) > 0 for d in demos)

    def ended(task: str) -> str:
        counts = ", ".join(f"{n} {status}" for (tk, status), n in sorted(ends.items()) if tk == task)
        return f"{task}: {counts} (longest {max(d.num_tokens for d in demos if d.task == task)} tokens)"

    per_task = "; ".join(ended(task) for task in sorted({d.task for d in demos}))
    hints = "; ".join(f"{status}: {_WHY[status]}" for status in sorted({s for _, s in ends}) if status in _WHY)
    what = "succeeded" if t.warm_start_successful_only else "is left after the held-out ones"
    return (f"warm start: none of the {len(demos)} expert demonstrations {what} ({wins} successful). How they ended: "
            f"{per_task}." + (f" {hints}." if hints else ""))


class WarmStart:
    """Supervised steps on the scripted expert's trajectories: its successful ones (rejection sampling), or
    all of them (`warm_start_successful_only=False`: plain imitation of an imperfect expert, whose mistakes RL then
    unlearns). `run` takes at most `warm_start_steps`; with `warm_start_target > 0` it stops as soon as every task's
    held-out successful demonstrations are reproducible (`imitation.reproduced_share`), wherever that happens
    on this machine. `step` is one more update (the control run's steps, `trainer.update=warm_start`)."""

    def __init__(self, model: torch.nn.Module, demos: list[Trajectory], t: TrainerConfig, seed: int, pad_id: int,
                 par: Parallel | None = None, rates: tuple[float, float] | None = None) -> None:
        """`rates`: (warm_start_lr, lr) measured before (a warm start restored from a checkpoint): no range test."""
        self.model, self.t, self.pad_id, self.par = model, t, pad_id, par or Parallel()
        self.train, self.held = split_demos(demos, t, seed)
        if not self.train:
            raise RuntimeError(no_demos_message(demos, t))
        if rates is not None:
            self.t = t = replace(t, warm_start_lr=rates[0], lr=rates[1])
        elif "auto" in (t.warm_start_lr, t.lr):  # measured here, on these demonstrations; `self.t` holds the numbers
            self.t = t = auto_rates(model, self.train, t, pad_id, self.par, seed)
        self.opt = torch.optim.AdamW(model.parameters(), lr=t.warm_start_lr, weight_decay=0.0)
        # short linear warm-up (warm_start_warmup_steps), then constant: a decaying rate slowed the tiny model's late
        # copy skills more than it steadied them; a pretrained model's warm start of a few steps wants little or none
        warmup = max(t.warm_start_warmup_steps, 1)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda i: min(1.0, (i + 1) / warmup))
        self.rng = random.Random(seed)  # the same draws on every rank: each runs its share of the same batch
        self.done = 0
        # the loss watch's fixed batch (`loss_watch`), drawn apart so the training draws stay as they were
        self.probe = random.Random(seed + 2).sample(self.train, min(t.warm_start_batch, len(self.train)))

    def state_dict(self) -> dict[str, Any]:
        """What continuing this warm start needs besides the model and `self.opt`'s tensors (JSON)."""
        version, draws, gauss = self.rng.getstate()
        return {"done": self.done, "rng": [version, list(draws), gauss], "scheduler": self.sched.state_dict(),
                "sft_lr": self.t.warm_start_lr, "lr": self.t.lr, "train": len(self.train)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where `state_dict` was taken (`self.opt`'s tensors are restored with the checkpoint's)."""
        if state["train"] != len(self.train):
            raise ValueError(f"the checkpoint's warm start drew from {state['train']} demonstrations, this one has "
                             f"{len(self.train)}: not the same expert demonstrations (shards/expert-0)")
        version, draws, gauss = state["rng"]
        self.rng.setstate((version, tuple(draws), gauss))
        self.sched.load_state_dict(state["scheduler"])
        self.done = int(state["done"])

    def step(self, batch: int = 0) -> dict[str, float]:
        """One update on `batch` demonstrations drawn without replacement (0: `warm_start_batch`)."""
        picked = self.rng.sample(self.train, min(batch or self.t.warm_start_batch, len(self.train)))
        batch = collate(picked, [0.0] * len(picked), self.pad_id)
        self.model.train()
        stats = warm_start_step(self.model, self.opt, batch, self.t, self.par)
        self.sched.step()
        self.done += 1
        return stats

    def run(self, monitor) -> dict[str, float]:
        """The warm start; returns the last step's statistics plus `sft_steps_done`."""
        t, stats, first = self.t, {}, None
        before = demo_fit(self.model, self.probe, self.pad_id) if t.warm_start_steps else None
        # rank 0's bar (a terminal) or a line every 30 s (a Slurm log); it may stop early, at warm_start_target
        bar = StepProgress(t.warm_start_steps, "warm start") if self.par.is_main else None
        for i in range(t.warm_start_steps):
            if self.held and i % t.warm_start_check_every == 0 and self._imitates(monitor, i):
                break
            stats = self.step()
            first = first or stats
            check_step(first, stats, i + 1, t.warm_start_lr)
            monitor.scalars({f"sft/{k}": v for k, v in stats.items()}, i)
            if bar is not None:
                bar.update(1, loss=stats["sft_loss"], token_acc=stats["sft_token_acc"])
            if i % 50 == 0 or i == t.warm_start_steps - 1:
                log.info("warm-start step %d/%d loss %.4f token_acc %.3f", i + 1, t.warm_start_steps, stats["sft_loss"],
                         stats["sft_token_acc"])
        else:
            if self.held and not self._imitates(monitor, t.warm_start_steps):
                log.warning("warm start: %d steps (the cap) without reaching warm_start_target %.2f on every task",
                            t.warm_start_steps, t.warm_start_target)
        if bar is not None:
            bar.close()
        if before is not None and self.done:
            after = demo_fit(self.model, self.probe, self.pad_id)
            before, after = self.par.broadcast_object((before, after))  # rank 0's verdict on every rank
            log.info("warm start: a fixed batch of its demonstrations went from loss %.4f (token_acc %.3f) to %.4f "
                     "(%.3f)", before.loss, before.token_acc, after.loss, after.token_acc)
            monitor.scalars({"sft/watch_loss_before": before.loss, "sft/watch_loss_after": after.loss}, self.done)
            check_end(before, after, self.done, t.warm_start_lr)
        log.info("warm start done after %d steps", self.done)
        return {**stats, "sft_steps_done": float(self.done)}

    def _imitates(self, monitor, step: int) -> bool:
        """Check `warm_start_target` on the held-out demonstrations (every rank runs it; rank 0's verdict counts)."""
        share = reproduced_share(self.model, self.held, self.pad_id, self.t.warm_start_min_token_prob)
        monitor.scalars({f"sft/reproduced/{task}": v for task, v in share.items()}, step)
        reached = bool(share) and min(share.values()) >= self.t.warm_start_target
        log.info("warm-start step %d: held-out successes reproducible %s%s", step,
                 {k: round(v, 3) for k, v in share.items()}, " (target reached)" if reached else "")
        return bool(self.par.broadcast_object(reached))
