"""The warm start watching its own loss: a warm start that makes the model worse at its own demonstrations stops
the run, naming the learning rate.

A rate fit for one model destroys another within a few steps: a base model under the smollm2-135m preset's
`warm_start_lr` 3e-4 went from loss 1.39 to 5.62 (token accuracy 0.84 to 0.49) in its 4 steps, and the run went on to RL
from a broken model without a word. Two checks, both on the demonstrations the warm start trains on:

    during    each step's loss (measured before its update, on its own batch) against the first step's: a rise
              past `rise_factor` x first + `rise_margin` stops the run there (batches differ, so the bar is loose)
    after     one fixed batch's loss before the first update and after the last (the same demonstrations, so the
              bar is tight): higher by more than `worse_factor` x before + `worse_margin` stops the run

A healthy warm start clears both by far (SmolLM2-135M-Instruct with chatml-tools: 0.80 -> 0.06 in 4 steps at
3e-4; the tiny model from scratch starts near ln(vocabulary) and only falls).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from agentrl.trainer.batch import collate
from agentrl.trainer.logprobs import run_head
from agentrl.types import Trajectory

RISE_FACTOR, RISE_MARGIN = 2.0, 0.5
WORSE_FACTOR, WORSE_MARGIN = 1.25, 0.05


class WarmStartDiverged(RuntimeError):
    """The warm start made the model worse on its own demonstrations (`trainer.warm_start_lr` too high for it)."""


@dataclass(frozen=True)
class DemoFit:
    loss: float
    """Mean negative log-likelihood of the demonstrations' action tokens."""
    token_acc: float
    """Share of action tokens that are the model's top choice."""


@torch.no_grad()
def demo_fit(model: torch.nn.Module, demos: list[Trajectory], pad_id: int) -> DemoFit:
    """How well `model` predicts the action tokens of `demos` (one forward; a collective under FSDP2, as every
    rank calls it with the same demos)."""
    was_training = model.training
    model.eval()
    batch = collate(demos, [0.0] * len(demos), pad_id)
    B, T = batch.tokens.shape
    mask = batch.mask.reshape(-1) > 0  # [B·(T-1)]
    select = (torch.arange(B)[:, None] * T + torch.arange(T - 1)).reshape(-1)[mask]  # [N] action positions
    nxt = batch.tokens[:, 1:].reshape(-1)[mask]  # [N]
    logp, _, top = run_head(model, batch.tokens, select, nxt, 1.0, "none", {"attention_mask": batch.attention})
    if was_training:
        model.train()
    n = max(int(mask.sum()), 1)
    return DemoFit(float(-logp.sum()) / n, float(top.sum()) / n)


def _stop(what: str, before: float, after: float, acc: str, steps: int, warm_start_lr: float) -> WarmStartDiverged:
    return WarmStartDiverged(
        f"warm start: {what} rose from {before:.3f} to {after:.3f}{acc} in {steps} step(s) at "
        f"trainer.warm_start_lr={warm_start_lr:g}: the warm start is making the model worse at its own demonstrations, "
        "so that learning rate is too high for this model. Lower trainer.warm_start_lr (python -m jobs.lr_range "
        "measures one on these demonstrations; trainer.warm_start_steps=0 skips the warm start)")


def check_step(first: dict[str, float], now: dict[str, float], step: int, warm_start_lr: float) -> None:
    """Raise WarmStartDiverged when step `step`'s loss (before its update) rose far past the first step's."""
    if now["sft_loss"] > RISE_FACTOR * first["sft_loss"] + RISE_MARGIN:
        acc = f" (token accuracy {first['sft_token_acc']:.2f} -> {now['sft_token_acc']:.2f})"
        raise _stop("the loss of each step's demonstrations", first["sft_loss"], now["sft_loss"], acc, step,
                    warm_start_lr)


def check_end(before: DemoFit, after: DemoFit, steps: int, warm_start_lr: float) -> None:
    """Raise WarmStartDiverged when the same demonstrations' loss is higher after the warm start than before."""
    if after.loss > WORSE_FACTOR * before.loss + WORSE_MARGIN:
        acc = f" (token accuracy {before.token_acc:.2f} -> {after.token_acc:.2f})"
        raise _stop("the loss of a fixed batch of its demonstrations", before.loss, after.loss, acc, steps,
                    warm_start_lr)
