"""One optimizer step: the RL update (advantages → task normalization → PPO [+ KL]) and one warm-start step.

The math comes from `agentrl.algorithms`; this module arranges it over micro-batches (padded or packed) and
data-parallel ranks so that the summed gradient equals the gradient of the whole batch's token-mean loss:
each micro-batch contributes its token *sum* divided by the batch's action-token count, and `Parallel`
turns the ranks' gradient average into a sum.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from agentrl.algorithms.advantages import ADVANTAGE_ESTIMATORS, token_advantages
from agentrl.algorithms.kl import KL_ESTIMATORS
from agentrl.algorithms.offpolicy import decoupled_ppo_loss, tis_ppo_loss
from agentrl.algorithms.ppo import ppo_loss
from agentrl.algorithms.task_norm import task_normalize
from agentrl.config import AlgoConfig, TrainerConfig
from agentrl.trainer.batch import (
    MicroBatch,
    TrainBatch,
    empty_micro_batch,
    layout,
    padding_fraction,
    plan_micro_batches,
)
from agentrl.trainer.head import EntropyMode
from agentrl.trainer.logprobs import head_outputs
from agentrl.trainer.parallel import Parallel


def advantages(batch: TrainBatch, algo: AlgoConfig) -> torch.Tensor:
    """Token advantages [B, T-1]: group estimator, broadcast to action tokens, then per-task normalization."""
    seq_adv = ADVANTAGE_ESTIMATORS[algo.adv_estimator](batch.rewards, batch.group_index, eps=algo.eps)  # [B]
    adv = token_advantages(seq_adv, batch.mask)  # [B, T-1]
    if algo.task_norm:
        adv = task_normalize(adv, batch.mask, batch.task_index, eps=algo.eps)
    return adv


def _pg_behaviour(logp: torch.Tensor, behaviour_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                  algo: AlgoConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO with the ratio against the engine's log-probs (the synchronous default)."""
    return ppo_loss(logp, behaviour_logp, adv, mask, algo.eps_low, algo.eps_high, algo.dual_clip,
                    reduction="token_sum")


def _pg_decoupled(logp: torch.Tensor, behaviour_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                  algo: AlgoConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Decoupled PPO; one optimizer step per batch makes π_prox the pre-step weights: `logp.detach()`, exact."""
    return decoupled_ppo_loss(logp, logp.detach(), behaviour_logp, adv, mask, algo.eps_low, algo.eps_high,
                              algo.dual_clip, weight=algo.is_weight, is_high=algo.is_cap, reduction="token_sum")


def _pg_tis(logp: torch.Tensor, behaviour_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
            algo: AlgoConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Truncated IS against the trainer's own recomputation of the sampling step (again `logp.detach()`)."""
    return tis_ppo_loss(logp, logp.detach(), behaviour_logp, adv, mask, algo.eps_low, algo.eps_high, algo.dual_clip,
                        cap=algo.is_cap, reduction="token_sum")


PG_LOSSES = {"behaviour": _pg_behaviour, "decoupled": _pg_decoupled, "tis": _pg_tis}

LossFn = Callable[[MicroBatch, "HeadOut"], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class HeadOut:
    """The head's outputs at a micro-batch's selected targets, on its [K, C] target grid (one row per trajectory)."""

    logp: torch.Tensor  # [K, C]
    entropy: torch.Tensor  # [K, C] (zeros unless asked for)
    top: torch.Tensor  # [K, C] bool: the target is the argmax


def accumulate(model: torch.nn.Module, batch: TrainBatch, per_target: dict[str, torch.Tensor], select: torch.Tensor,
               loss_fn: LossFn, par: Parallel, trainer: TrainerConfig, temperature: float = 1.0,
               entropy: EntropyMode = "none") -> tuple[torch.Tensor, dict[str, float]]:
    """Forward/backward over this rank's share of the batch's micro-batches; gradients accumulate in `.grad`.

    The head runs only at `select` [B, T-1] (`logprobs.head_outputs`). Every micro-batch is laid out on the host
    before the first forward, so the device loop holds nothing but forward, loss and backward: no host sync, no
    Python per token. `loss_fn(mb, out)` returns (loss to differentiate, already divided by the global normalizer;
    vector of statistic *sums*). The micro-batches hold at most `trainer.micro_batch_tokens` token slots each, in
    the packed layout if `trainer.packing`. Returns the statistic sums over all ranks, and layout figures.
    """
    rows = plan_micro_batches(batch.lengths, trainer.micro_batch_tokens, trainer.packing)
    mine = par.share(len(rows))
    mbs = [(layout(batch, rows[j], per_target, trainer.packing, select) if j is not None else
            empty_micro_batch(per_target, batch.pad_id, trainer.packing)).to(par.device) for j in mine]
    sums: torch.Tensor | None = None
    for k, mb in enumerate(mbs):
        with par.grad_sync(model, last=k == len(mbs) - 1):
            with par.autocast():
                logp, ent, top = head_outputs(model, mb, temperature, entropy)
                loss, stats = loss_fn(mb, HeadOut(mb.grid(logp), mb.grid(ent), mb.grid(top)))
            (loss * par.grad_scale).backward()
        stats = stats.detach().double()  # summed on the device: one transfer per step, not a sync per micro-batch
        sums = stats if sums is None else sums + stats
    assert sums is not None  # every rank runs at least one micro-batch
    layout_stats = {"padding_frac": padding_fraction(rows, batch.lengths), "micro_batches": float(len(rows))}
    return par.all_reduce_sum(sums).cpu(), layout_stats


def rl_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: TrainBatch, algo: AlgoConfig,
            trainer: TrainerConfig, temperature: float, ref_model: torch.nn.Module | None = None,
            par: Parallel | None = None) -> dict[str, float]:
    """Accumulate the PPO gradient (plus β·KL to `ref_model` when algo.kl_coef > 0), clip, step.

    Args:
        algo: the loss (advantage estimator, task normalization, clipping, off-policy correction, KL, entropy).
        trainer: the step's layout and clipping (`micro_batch_tokens`, `packing`, `grad_clip`).
        temperature: the sampler's (`rollout.temperature`): the log-probs divide the logits by it, as the
            engine did.

    Every rank passes the same whole `batch`; each runs its share of the micro-batches. Returns scalar
    statistics of the whole batch (identical on every rank).
    """
    par = par or Parallel()
    adv = advantages(batch, algo)
    total = max(batch.num_action_tokens, 1)
    use_kl = ref_model is not None and algo.kl_coef > 0
    if algo.kl_coef > 0 and ref_model is None:
        raise ValueError("kl_coef > 0 needs the frozen reference model")

    def loss_fn(mb: MicroBatch, out: HeadOut) -> tuple[torch.Tensor, torch.Tensor]:
        m = mb.targets["mask"]  # [K, C]: one row per trajectory, its action tokens
        on = m > 0
        n = m.sum()
        logp = out.logp
        pg_sum, st = PG_LOSSES[algo.offpolicy](logp, mb.targets["behaviour_logp"], mb.targets["adv"], m, algo)
        loss = pg_sum
        ent_sum = torch.where(on, out.entropy, 0.0).sum()  # a graph only when entropy_coef != 0 (`entropy` mode)
        if algo.entropy_coef:
            loss = loss - algo.entropy_coef * ent_sum
        kl_sum = torch.zeros((), device=logp.device)
        if use_kl:
            with torch.no_grad():
                ref_logp = mb.grid(head_outputs(ref_model, mb, temperature, "none")[0])  # [K, C]
            kl_sum = torch.where(on, KL_ESTIMATORS[algo.kl_estimator](logp, ref_logp), 0.0).sum()
            loss = loss + algo.kl_coef * kl_sum
        stats = torch.stack([loss.detach(), pg_sum.detach(), kl_sum.detach(), ent_sum.detach(), st["clipfrac"] * n,
                             st["dual_clipfrac"] * n, st["approx_kl"] * n]).float()
        return loss / total, stats

    optimizer.zero_grad(set_to_none=True)
    per_target = {"mask": batch.mask, "behaviour_logp": batch.behaviour_logp, "adv": adv}
    sums, lay = accumulate(model, batch, per_target, batch.mask > 0, loss_fn, par, trainer, temperature,
                           "grad" if algo.entropy_coef else "value")
    grad_norm = par.clip_grad_norm(model.parameters(), trainer.grad_clip)
    skipped = not math.isfinite(grad_norm)
    if skipped:  # never publish weights a NaN/inf gradient touched
        optimizer.zero_grad(set_to_none=True)
    else:
        optimizer.step()
    names = ("loss", "pg_loss", "kl", "entropy", "clipfrac", "dual_clipfrac", "approx_kl")
    out = {k: float(v) / total for k, v in zip(names, sums.tolist())}
    out.update(lay)
    out.update({"grad_norm": grad_norm, "action_tokens": float(total), "skipped_step": float(skipped)})
    for k, name in enumerate(batch.task_names):
        sel = (batch.task_index[:, None] == k) & (batch.mask > 0)
        if sel.any():
            out[f"adv/{name}/mean"] = float(adv[sel].mean())
            out[f"adv/{name}/std"] = float(adv[sel].std(unbiased=False))
    return out


def warm_start_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: TrainBatch, trainer: TrainerConfig,
             par: Parallel | None = None) -> dict[str, float]:
    """Cross-entropy on action tokens, or on every real token if `trainer.warm_start_all_tokens` (token mean over the
    batch), laid out as `rl_step` lays out its batch (`trainer.micro_batch_tokens`, `trainer.packing`) and clipped
    at `trainer.grad_clip`.

    `sft_token_acc` is measured on the action tokens either way.
    """
    par = par or Parallel()
    loss_mask = batch.attention[:, 1:].float() if trainer.warm_start_all_tokens else batch.mask  # [B, T-1]
    total = max(float(loss_mask.sum()), 1.0)

    def loss_fn(mb: MicroBatch, out: HeadOut) -> tuple[torch.Tensor, torch.Tensor]:
        nll = -torch.where(mb.targets["loss_mask"] > 0, out.logp, 0.0).sum()
        hit = out.top & (mb.targets["mask"] > 0)
        return nll / total, torch.stack([nll.detach(), hit.sum().float()])

    optimizer.zero_grad(set_to_none=True)
    select = (loss_mask > 0) | (batch.mask > 0)  # the head runs where the loss or the accuracy needs it
    sums, lay = accumulate(model, batch, {"loss_mask": loss_mask, "mask": batch.mask}, select, loss_fn, par, trainer)
    grad_norm = par.clip_grad_norm(model.parameters(), trainer.grad_clip)
    if math.isfinite(grad_norm):
        optimizer.step()
    else:
        optimizer.zero_grad(set_to_none=True)
    nll, correct = sums.tolist()
    return {"sft_loss": nll / total, "sft_token_acc": correct / max(batch.num_action_tokens, 1),
            "grad_norm": grad_norm, **lay}
