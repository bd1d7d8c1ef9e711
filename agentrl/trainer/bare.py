"""The bare step: the least any policy-gradient trainer does with the same model and micro-batches, the yardstick
that `jobs.bench_trainer` and `jobs.gpu_check` time our `rl_step` against (ours / bare).

Per micro-batch: the sampled tokens' log-probs, a token sum of −logp·A over the batch's action tokens, backward;
then gradient clipping and one optimizer step. It gets its micro-batches already laid out (`bare_batches`, outside
any timing) and computes nothing else: no advantages, no PPO ratio or clipping, no statistics. Its head is ours
(`head="lean"`: the tiled head on the action tokens, through the model's own forward so FSDP2 and DDP work) or the
old whole-vocabulary log-softmax at every position (`head="full"`), which the trainer used before the tiled head.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from agentrl.trainer import attention
from agentrl.trainer.batch import MicroBatch, TrainBatch, empty_micro_batch, layout, plan_micro_batches
from agentrl.trainer.logprobs import run_head
from agentrl.trainer.parallel import Parallel


@dataclass
class BareBatch:
    """A micro-batch as the bare step consumes it: model inputs, and the advantages of its action tokens both at
    the selected positions ([N], for the tiled head) and on the [R, L-1] grid (for the whole-vocabulary head)."""

    mb: MicroBatch
    decoder: dict[str, Any]
    adv: torch.Tensor  # [N]
    adv_rows: torch.Tensor  # [R, L-1], 0 off action tokens


def bare_batch(mb: MicroBatch, impl: str) -> BareBatch:
    R, L = mb.tokens.shape
    adv = mb.targets["adv"].reshape(-1)[mb.dest]  # [N]
    rows = adv.new_zeros(R * L).index_copy(0, mb.select, adv).view(R, L)[:, :-1]
    kwargs = attention.decoder_inputs(impl, (R, L), mb.attention, mb.position_ids, mb.cu_seqlens, mb.max_seqlen)
    return BareBatch(mb, kwargs, adv, rows)


def bare_batches(batch: TrainBatch, adv: torch.Tensor, micro_batch_tokens: int, packing: bool, impl: str,
                 par: Parallel) -> list[BareBatch]:
    """This rank's share of the batch's micro-batches (the same rows and packing as `rl_step`), on its device."""
    rows = plan_micro_batches(batch.lengths, micro_batch_tokens, packing)
    per_target = {"mask": batch.mask, "adv": adv}
    mbs = [layout(batch, rows[j], per_target, packing) if j is not None else
           empty_micro_batch(per_target, batch.pad_id, packing) for j in par.share(len(rows))]
    return [bare_batch(mb.to(par.device), impl) for mb in mbs]


def bare_step(model: torch.nn.Module, opt: torch.optim.Optimizer, bbs: list[BareBatch], total: int,
              grad_clip: float, head: str = "lean", par: Parallel | None = None) -> None:
    """One bare step over `bbs` (this rank's micro-batches), `total` action tokens in the whole batch."""
    par = par or Parallel()
    opt.zero_grad(set_to_none=True)
    for k, b in enumerate(bbs):
        mb = b.mb
        with par.grad_sync(model, last=k == len(bbs) - 1), par.autocast():
            if head == "lean":
                logp = run_head(model, mb.tokens, mb.select, mb.next_tokens, 1.0, "none", b.decoder)[0]  # [N]
                loss = -(logp * b.adv).sum() / total
            else:
                logits = model(input_ids=mb.tokens, use_cache=False, **b.decoder).logits[:, :-1].float()  # [R, L-1, V]
                logp = torch.log_softmax(logits, -1).gather(-1, mb.tokens[:, 1:, None]).squeeze(-1)  # [R, L-1]
                loss = -(logp * b.adv_rows).sum() / total
            (loss * par.grad_scale).backward()
    par.clip_grad_norm(model.parameters(), grad_clip)
    opt.step()
