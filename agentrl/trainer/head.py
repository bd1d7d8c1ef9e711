"""The language-model head without a vocabulary-sized float32 tensor: log-probs, entropy and argmax hits of chosen
positions, computed tile by tile over (rows, vocabulary) with an online logsumexp.

What it replaces: `logits = lm_head(hidden).float(); log_softmax(logits)` over every position, which keeps
[positions, V] float32 tensors alive for the backward pass (10 GB per copy at 16k tokens and Qwen2.5's 151,936
tokens). Here the caller hands over only the hidden states of the positions it trains or measures ([N, D]), and
`head_logprobs` runs the head on tiles of at most `tile_elements` logits:

    forward   per row tile, per vocabulary tile: z = h·Wᵀ/τ (+ b/τ) in the compute dtype, upcast to float32; keep a
              running max m, Σ e^(z−m) and (for the entropy) Σ e^(z−m)·z, and the target's logit. Only logZ [N] and
              E_p[z] [N] are saved for the backward pass, beside the inputs themselves.
    backward  recomputes each tile's logits: ∂logp_y/∂z = 1[y] − p, ∂H/∂z = −p·(z − E_p[z]); accumulates ∂h in
              float32 [N, D] and writes ∂W one vocabulary tile at a time.

Exact up to summation order: float64 inputs give float64 results (the tests compare against the full log-softmax to
1e-6). Mixed precision: the matmuls run in the autocast dtype when autocast is on (else the inputs' dtype), the
softmax arithmetic in float32, as the full-vocabulary path did. This module is pure tensor math: the caller picks
the rows and makes sure the head's weight is unsharded where this runs (`trainer.logprobs`).
"""
from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

EntropyMode = Literal["none", "value", "grad"]
"""none: not computed (zeros) | value: computed, no gradient | grad: differentiable (algo.entropy_coef != 0)."""

TILE_ELEMENTS = {"cuda": 1 << 26, "cpu": 1 << 22}
"""Logits per tile by device: 2^26 float32 (256 MB per temporary) keeps a GPU's matmuls large; 2^22 (16 MB) keeps a
CPU's tiles in cache."""
VOCAB_TILE = 8192


def _tiles(n: int, size: int) -> list[tuple[int, int]]:
    return [(i, min(i + size, n)) for i in range(0, n, size)]


def tile_shape(n_rows: int, vocab: int, tile_elements: int, vocab_tile: int = VOCAB_TILE) -> tuple[int, int]:
    """(rows, vocabulary columns) per tile: vocabulary tiles of up to `vocab_tile`, as many rows as fit."""
    cols = min(vocab, vocab_tile)
    return max(1, min(max(n_rows, 1), tile_elements // cols)), cols


def _compute_dtype(hidden: Tensor, weight: Tensor) -> torch.dtype:
    dev = hidden.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _tile_logits(h: Tensor, w: Tensor, b: Tensor | None, inv_temp: float, acc: torch.dtype) -> Tensor:
    """z = (h·wᵀ + b) / τ in the accumulation dtype.  h [n, D], w [v, D], b [v] → [n, v]"""
    z = (h @ w.t() if b is None else torch.addmm(b, h, w.t())).to(acc)
    return z.mul_(inv_temp) if inv_temp != 1.0 else z


def _target_logit(z: Tensor, targets: Tensor, c0: int) -> Tensor:  # z [n, v], targets [n] → [n], 0 off this tile
    local = targets - c0
    hit = (local >= 0) & (local < z.shape[1])
    return torch.where(hit, z.gather(1, local.clamp(0, z.shape[1] - 1)[:, None]).squeeze(1), 0.0)


class _FusedHead(torch.autograd.Function):
    """(hidden [N, D], weight [V, D], bias [V] | None, targets [N]) → (logp [N], entropy [N], top [N] bool)."""

    @staticmethod
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, inv_temp: float,
                entropy: str, tile: tuple[int, int]) -> tuple[Tensor, Tensor, Tensor]:
        dt = _compute_dtype(hidden, weight)
        acc = torch.promote_types(dt, torch.float32)
        n, v = hidden.shape[0], weight.shape[0]
        rows, cols = tile_shape(n, v, *tile)
        logz = torch.empty(n, dtype=acc, device=hidden.device)
        ez = torch.zeros(n, dtype=acc, device=hidden.device)
        zy = torch.empty(n, dtype=acc, device=hidden.device)
        top = torch.empty(n, dtype=torch.bool, device=hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):
            w, b = weight.to(dt), None if bias is None else bias.to(dt)
            for r0, r1 in _tiles(n, rows):
                h, y = hidden[r0:r1].to(dt), targets[r0:r1]
                m = torch.full((r1 - r0,), float("-inf"), dtype=acc, device=hidden.device)
                s, t, zt = torch.zeros_like(m), torch.zeros_like(m), torch.zeros_like(m)
                for c0, c1 in _tiles(v, cols):
                    z = _tile_logits(h, w[c0:c1], None if b is None else b[c0:c1], inv_temp, acc)  # [n, v]
                    m_new = torch.maximum(m, z.amax(1))
                    scale = torch.exp(m - m_new)
                    e = z.sub(m_new[:, None]).exp_()  # [n, v]
                    s = s * scale + e.sum(1)
                    if entropy != "none":
                        t = t * scale + torch.linalg.vecdot(e, z)
                    zt += _target_logit(z, y, c0)
                    m = m_new
                logz[r0:r1] = m + s.log()
                if entropy != "none":
                    ez[r0:r1] = t / s
                zy[r0:r1], top[r0:r1] = zt, zt >= m
        logp = zy - logz
        ent = logz - ez if entropy != "none" else torch.zeros_like(logz)
        ctx.save_for_backward(hidden, weight, bias, targets, logz, ez)
        ctx.inv_temp, ctx.dt, ctx.acc, ctx.tile, ctx.has_bias = inv_temp, dt, acc, (rows, cols), bias is not None
        ctx.mark_non_differentiable(top)
        if entropy != "grad":
            ctx.mark_non_differentiable(ent)
        ctx.set_materialize_grads(False)
        return logp, ent, top

    @staticmethod
    def backward(ctx: Any, g_logp: Tensor | None, g_ent: Tensor | None, _: Any) -> tuple[Tensor | None, ...]:
        hidden, weight, bias, targets, logz, ez = ctx.saved_tensors
        dt, acc, (rows, cols), inv_temp = ctx.dt, ctx.acc, ctx.tile, ctx.inv_temp
        n, v = hidden.shape[0], weight.shape[0]
        g_lp = torch.zeros(n, dtype=acc, device=hidden.device) if g_logp is None else g_logp.to(acc)
        dh = torch.zeros(hidden.shape, dtype=acc, device=hidden.device)  # [N, D]
        dw = torch.empty(weight.shape, dtype=weight.dtype, device=weight.device)  # [V, D]
        db = torch.empty(v, dtype=bias.dtype, device=bias.device) if ctx.has_bias else None
        with torch.autocast(hidden.device.type, enabled=False):
            w, b = weight.to(dt), None if bias is None else bias.to(dt)
            hs = hidden.to(dt)
            for c0, c1 in _tiles(v, cols):
                dw_c = torch.zeros((c1 - c0, hidden.shape[1]), dtype=acc, device=hidden.device)  # [v, D]
                db_c = torch.zeros(c1 - c0, dtype=acc, device=hidden.device)
                for r0, r1 in _tiles(n, rows):
                    h = hs[r0:r1]
                    z = _tile_logits(h, w[c0:c1], None if b is None else b[c0:c1], inv_temp, acc)  # [n, v]
                    p = z.sub(logz[r0:r1, None]).exp_()
                    coef = g_lp[r0:r1, None]
                    if g_ent is not None:
                        coef = coef + g_ent[r0:r1, None].to(acc) * (z - ez[r0:r1, None])
                    dz = p.mul_(coef).neg_()  # [n, v]: −p·(g_logp + g_H·(z − E[z]))
                    local = targets[r0:r1] - c0
                    hit = (local >= 0) & (local < c1 - c0)
                    dz.scatter_add_(1, local.clamp(0, c1 - c0 - 1)[:, None],
                                    torch.where(hit, g_lp[r0:r1], 0.0)[:, None])  # + g_logp at the target
                    if inv_temp != 1.0:
                        dz.mul_(inv_temp)
                    dzc = dz.to(dt)
                    dh[r0:r1] += (dzc @ w[c0:c1]).to(acc)
                    dw_c += (dzc.t() @ h).to(acc)
                    if db is not None:
                        db_c += dz.sum(0)
                dw[c0:c1] = dw_c
                if db is not None:
                    db[c0:c1] = db_c
        return dh.to(hidden.dtype), dw, db, None, None, None, None


def head_logprobs(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, temperature: float = 1.0,
                  entropy: EntropyMode = "value", tile_elements: int | None = None, vocab_tile: int = VOCAB_TILE
                  ) -> tuple[Tensor, Tensor, Tensor]:
    """Log-prob of each row's target, the entropy of each row's distribution and whether the target is its argmax.

    Args:
        hidden: [N, D] final hidden states of the chosen positions (after the final norm).
        weight: [V, D] the head's weight (the embedding matrix of a tied head); bias: [V] or None.
        targets: [N] long, the next token of each row.
        temperature: the sampler's; logits are divided by it (0 or 1: as they are).
        entropy: see `EntropyMode`.
        tile_elements: logits per tile (default by device, `TILE_ELEMENTS`); vocab_tile: vocabulary columns per tile.

    Returns:
        logp [N] (float32, float64 for float64 inputs), entropy [N] (zeros when `entropy="none"`),
        top [N] bool (the target's logit is the largest: argmax up to ties).
    """
    inv_temp = 1.0 / temperature if temperature > 0 and temperature != 1.0 else 1.0
    tile = tile_elements or TILE_ELEMENTS.get(hidden.device.type, TILE_ELEMENTS["cuda"])
    return _FusedHead.apply(hidden, weight, bias, targets, inv_temp, entropy, (tile, vocab_tile))

