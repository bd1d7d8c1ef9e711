"""From trajectories to training tensors: the padded batch, micro-batches by token budget, sequence packing.

Positions are aligned to *targets*: column t of every [B, T-1] tensor refers to predicting token t+1 from
tokens 0..t, so `mask[:, t]` is the loss mask of token t+1 and `behaviour_logp[:, t]` its sampled log-prob.

`collate` makes one right-padded [B, T] batch of the whole step; everything computed over the batch as a
whole (group advantages, task statistics, the token count of the loss mean) is computed there. The
forward/backward passes then run over micro-batches planned by `plan_micro_batches`, in one of two layouts:

- padded: one trajectory per row, rows of similar length together (the batch is sorted longest first);
- packed: several trajectories share a row back to back, told apart by position ids that restart at 0
  (Hugging Face models then build a block-diagonal causal mask, so no token attends across trajectories).
  Rows hold at most as many tokens as the longest trajectory of the step, so attention costs no more per
  token than in the padded layout, while the padding all but disappears.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from agentrl.types import Trajectory

MicroBatchRows = list[list[list[int]]]
"""micro-batches → rows → indices of the trajectories (rows of the TrainBatch) laid out in that row."""


@dataclass
class TrainBatch:
    tokens: torch.Tensor  # [B, T] long, right-padded with pad_id
    attention: torch.Tensor  # [B, T] long, 1 on real tokens
    mask: torch.Tensor  # [B, T-1] float, 1 on action-token targets
    behaviour_logp: torch.Tensor  # [B, T-1]
    rewards: torch.Tensor  # [B]
    group_index: torch.Tensor  # [B] long, 0..G-1
    task_index: torch.Tensor  # [B] long, into task_names
    task_names: list[str]
    pad_id: int = 0

    @property
    def num_action_tokens(self) -> int:
        return int(self.mask.sum().item())

    @cached_property
    def lengths(self) -> list[int]:
        """Tokens of each trajectory (computed once: the layout of every micro-batch reads them)."""
        return self.attention.sum(1).tolist()


def collate(trajs: list[Trajectory], rewards: list[float], pad_id: int) -> TrainBatch:
    """Pad trajectories (rows sorted by length, longest first, so micro-batches trim padding)."""
    order = sorted(range(len(trajs)), key=lambda i: -trajs[i].num_tokens)
    trajs = [trajs[i] for i in order]
    rewards = [rewards[i] for i in order]
    B, T = len(trajs), max(t.num_tokens for t in trajs)
    tokens = torch.full((B, T), pad_id, dtype=torch.long)
    attention = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T)
    blogp = torch.zeros(B, T)
    for i, t in enumerate(trajs):
        n = t.num_tokens
        tokens[i, :n] = torch.from_numpy(t.tokens.astype("int64"))
        attention[i, :n] = 1
        mask[i, :n] = torch.from_numpy(t.loss_mask.astype("float32"))
        blogp[i, :n] = torch.from_numpy(t.logprobs)
    groups = {g: k for k, g in enumerate(dict.fromkeys(t.group_id for t in trajs))}
    tasks = list(dict.fromkeys(t.task for t in trajs))
    return TrainBatch(
        tokens=tokens, attention=attention, mask=mask[:, 1:], behaviour_logp=blogp[:, 1:],
        rewards=torch.tensor(rewards, dtype=torch.float32),
        group_index=torch.tensor([groups[t.group_id] for t in trajs]),
        task_index=torch.tensor([tasks.index(t.task) for t in trajs]), task_names=tasks, pad_id=pad_id,
    )


# ------------------------------------------------------------------------------------------------ planning

def plan_micro_batches(lengths: list[int], micro_batch_tokens: int, packing: bool) -> MicroBatchRows:
    """Split trajectories of the given lengths into micro-batches of at most `micro_batch_tokens` slots (rows × row
    length, padding included); a trajectory longer than the budget gets a micro-batch of its own.

    Padded (`packing` false): one trajectory per row. Packed: first-fit decreasing into rows of capacity
    max(lengths). Either way the rows, longest first, are then grouped greedily: consecutive rows while rows × widest
    row fits.
    The rows depend on the lengths only, so every data-parallel rank computes the same ones.
    """
    if not lengths:
        return []
    if not packing:
        rows = [[i] for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))]
        return _group_rows(rows, [lengths[r[0]] for r in rows], micro_batch_tokens)
    capacity = max(lengths)
    rows = []
    fill: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for r, used in enumerate(fill):
            if used + lengths[i] <= capacity:
                rows[r].append(i)
                fill[r] += lengths[i]
                break
        else:
            rows.append([i])
            fill.append(lengths[i])
    order = sorted(range(len(rows)), key=lambda r: (-fill[r], r))
    return _group_rows([rows[r] for r in order], [fill[r] for r in order], micro_batch_tokens)


def _group_rows(rows: list[list[int]], widths: list[int], micro_batch_tokens: int) -> MicroBatchRows:
    """Consecutive rows (widths non-increasing) per micro-batch while count × first width ≤ micro_batch_tokens."""
    out: MicroBatchRows = []
    start = 0
    while start < len(rows):
        end = start + 1
        while end < len(rows) and (end + 1 - start) * widths[start] <= micro_batch_tokens:
            end += 1
        out.append(rows[start:end])
        start = end
    return out


def padding_fraction(rows: MicroBatchRows, lengths: list[int]) -> float:
    """Share of the micro-batches' token slots that hold padding, not trajectory tokens."""
    slots = real = 0
    for mb in rows:
        fills = [sum(lengths[i] for i in row) for row in mb]
        slots += len(mb) * max(fills)
        real += sum(fills)
    return 1.0 - real / slots if slots else 0.0


# ------------------------------------------------------------------------------------------------ layout

@dataclass
class MicroBatch:
    """Model inputs of one micro-batch, in the padded or the packed layout, and the targets it trains or measures.

    Only the selected positions reach the language-model head (`trainer.head`): `select` holds their flat index in
    the [R, L] token grid and `next_tokens` the token each one predicts. Per-target values (mask, advantages,
    behaviour log-probs…) come as a [K, C] grid with one row per trajectory (its selected targets in order, zeros
    after), so that per-sequence reductions see trajectories, never packed rows; `grid` puts a head output there.
    """

    tokens: torch.Tensor  # [R, L] long
    attention: torch.Tensor | None  # [R, L] long (padded layout); None when packed
    position_ids: torch.Tensor | None  # [R, L] long, restarting at 0 per trajectory (packed layout)
    select: torch.Tensor  # [N] long, r·L + t: positions whose next token is a target
    next_tokens: torch.Tensor  # [N] long
    dest: torch.Tensor  # [N] long, k·C + c: where each selected position sits in the [K, C] target grid
    targets: dict[str, torch.Tensor]  # name → [K, C]
    cu_seqlens: torch.Tensor  # [S+1] int32: boundaries of the segments (trajectories, padding tails) of the R·L tokens
    max_seqlen: int
    shape: tuple[int, int]  # (K, C) of the target grid

    def grid(self, x: torch.Tensor) -> torch.Tensor:  # [N] → [K, C], zeros off the selected positions
        K, C = self.shape
        return x.new_zeros(K * C).index_copy(0, self.dest, x).view(K, C)

    def to(self, device: torch.device | str) -> MicroBatch:
        device = torch.device(device)

        def mv(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None or t.device == device:
                return t
            return (t.pin_memory() if device.type == "cuda" else t).to(device, non_blocking=True)

        return MicroBatch(mv(self.tokens), mv(self.attention), mv(self.position_ids), mv(self.select),
                          mv(self.next_tokens), mv(self.dest), {k: mv(v) for k, v in self.targets.items()},
                          mv(self.cu_seqlens), self.max_seqlen, self.shape)


def layout(batch: TrainBatch, rows: list[list[int]], per_target: dict[str, torch.Tensor], packing: bool,
           select: torch.Tensor | None = None) -> MicroBatch:
    """Gather the trajectories of `rows` into one micro-batch (index arithmetic on the host, no per-token loop).

    Args:
        batch: the step's padded batch.
        rows: rows of trajectory indices (one index per row unless `packing`).
        per_target: name → [B, T-1] tensors aligned to targets (mask, advantages, behaviour log-probs…).
        packing: lay several trajectories per row, with position ids restarting at each one.
        select: [B, T-1] bool, the targets to compute (default: the action tokens, `batch.mask > 0`); zero past
            each trajectory's end.

    Returns:
        A MicroBatch whose target grid holds, for each trajectory of `rows` (row-major order) and each of its selected
        targets in order, the value of the same target in `per_target`.
    """
    select = batch.mask > 0 if select is None else select
    lens = batch.lengths
    order = [i for row in rows for i in row]
    fills = [sum(lens[i] for i in row) for row in rows]
    R, width = len(rows), max(fills)
    starts, segs = [], []  # flat start of each trajectory; segment lengths (trajectories, then each row's tail)
    for r, row in enumerate(rows):
        off = r * width
        for i in row:
            starts.append(off)
            segs.append(lens[i])
            off += lens[i]
        if fills[r] < width:
            segs.append(width - fills[r])
    idx, n = torch.tensor(order), torch.tensor([lens[i] for i in order])
    seg = torch.tensor(segs)
    cu = torch.zeros(len(segs) + 1, dtype=torch.int32)
    torch.cumsum(seg, 0, out=cu[1:])
    if packing:
        src = torch.repeat_interleave(idx, n)  # [sum n]: trajectory of each real token
        within = torch.arange(int(n.sum())) - torch.repeat_interleave(torch.cumsum(n, 0) - n, n)
        tokens = torch.full((R * width,), batch.pad_id, dtype=torch.long)
        tokens[torch.repeat_interleave(torch.tensor(starts), n) + within] = batch.tokens[src, within]
        positions = torch.arange(R * width) - torch.repeat_interleave(cu[:-1].long(), seg)  # restart per segment
        tokens, attention, positions = tokens.view(R, width), None, positions.view(R, width)
    else:
        tokens, attention, positions = batch.tokens[idx, :width], batch.attention[idx, :width], None
    sub = select[idx, : width - 1] if width > 1 else select[idx, :0]  # [K, ≤ T-1]
    j, c = sub.nonzero(as_tuple=True)  # row-major: by trajectory, then position
    counts = sub.sum(1)
    C = max(int(counts.max()) if counts.numel() else 0, 1)
    pos = torch.arange(j.numel()) - (torch.cumsum(counts, 0) - counts)[j]
    targets = {}
    for k, v in per_target.items():
        g = v.new_zeros(len(order), C)
        g[j, pos] = v[idx[j], c]
        targets[k] = g
    return MicroBatch(tokens, attention, positions, torch.tensor(starts)[j] + c, batch.tokens[idx[j], c + 1],
                      j * C + pos, targets, cu, int(seg.max()), (len(order), C))


def empty_micro_batch(per_target: dict[str, torch.Tensor], pad_id: int, packing: bool) -> MicroBatch:
    """Two pad tokens and no target: the stand-in a rank runs when it has fewer micro-batches than another,
    so that every rank makes the same collective calls (all-gathers, gradient reductions)."""
    tokens = torch.full((1, 2), pad_id, dtype=torch.long)
    none = torch.zeros(0, dtype=torch.long)
    targets = {k: v.new_zeros(1, 1) for k, v in per_target.items()}
    cu = torch.tensor([0, 2], dtype=torch.int32)
    attention, positions = (None, torch.arange(2)[None]) if packing else (torch.ones(1, 2, dtype=torch.long), None)
    return MicroBatch(tokens, attention, positions, none, none, none, targets, cu, 2, (1, 1))
