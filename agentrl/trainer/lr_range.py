"""The warm start's learning-rate range test: which `trainer.warm_start_lr` suits *this* model on *these*
demonstrations.

A rate fit for one model destroys another (a base model under the smollm2-135m preset's 3e-4 went from loss 1.39
to 5.62 in 4 steps), so a pretrained model's rate is measured, not copied from a preset. For each rate of a
geometric grid, from the same starting weights each time, a few warm-start steps (`warm_start_step`: the warm start's
loss, micro-batching and frozen layers) are taken on the same draws of demonstrations, and one fixed held-out batch
of demonstrations is scored before and after (`loss_watch.demo_fit`). The rule (`pick_rate`):

    rises     a rate rises when the held-out loss after its steps is higher than before by more than `RISE_TOL`
              (2%) of it, or not finite: the first rate that rises, and every rate above it, is out (the 2%: a
              tiny rate moves a loss of 5.668 to 5.6685, noise, not harm)
    clear     a rate lowers the loss clearly when its drop (before - after) is at least `MIN_DROP` (10%) of the
              loss before, and at least `BEST_SHARE` (half) of the best drop on the grid: a rate that barely
              helps where a smaller one helps a lot is already past the useful range
    pick      the largest rate below the first that rises which lowers the held-out loss clearly

The RL rate is a fixed fraction of the warm start's (`RL_FRACTION`, from the one pair measured to work on a real
model: see docs/models.md, "Learning rates follow the model's source").

`python -m jobs.lr_range` runs it on a model directory; `trainer.warm_start_lr: auto` runs it at the start of the warm
start (`warm_start.WarmStart`). This module is the rule and the runner; it plays no episodes (the demonstrations
come from the caller).
"""
from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from agentrl.config import TrainerConfig
from agentrl.trainer.batch import collate
from agentrl.trainer.loss_watch import WarmStartDiverged, demo_fit
from agentrl.trainer.parallel import Parallel
from agentrl.trainer.step import warm_start_step
from agentrl.types import Trajectory

log = logging.getLogger("agentrl.trainer")

RISE_TOL = 0.02
"""A rise: the held-out loss after exceeds the loss before by more than this share of it."""
MIN_DROP = 0.10
"""A clear drop: at least this share of the held-out loss before."""
BEST_SHARE = 0.5
"""A clear drop: at least this share of the best drop on the grid."""
RL_FRACTION = 1 / 20
"""`trainer.lr` = this x `trainer.warm_start_lr` (`lr: auto`). SmolLM2-135M-Instruct is the one real model RL has been
shown to work on, at lr 5e-5 (+0.45 over its warm start, 7.4 s.e. above the imitation control); on its demonstrations
this range test picks 1e-3 (docs/models.md), and 5e-5 / 1e-3 = 1/20. (Its preset's own pair, warm_start_lr 3e-4 and lr
5e-5, was set by hand; the RL rate is the one that was measured to work, so the fraction is taken against the test's
pick.)"""


def geometric_grid(low: float, high: float, points: int) -> tuple[float, ...]:
    """`points` rates from `low` to `high`, evenly spaced in log (both ends included)."""
    if points == 1:
        return (low,)
    ratio = (high / low) ** (1 / (points - 1))
    return tuple(float(f"{low * ratio ** i:.3g}") for i in range(points))


GRID = geometric_grid(1e-6, 1e-2, 9)
"""The default candidates: 1e-6 .. 1e-2, two a decade (1e-6, 3.16e-6, 1e-5, ...)."""


@dataclass(frozen=True)
class RatePoint:
    """One candidate rate's measurement."""

    lr: float
    train_losses: tuple[float, ...]
    """Each step's loss on its own batch, measured before that step's update."""
    before: float
    """The held-out batch's loss at the starting weights."""
    after: float
    """The held-out batch's loss after the steps at `lr`."""

    @property
    def rises(self) -> bool:
        return not math.isfinite(self.after) or self.after > self.before * (1 + RISE_TOL)

    @property
    def drop(self) -> float:
        """(before - after) / before: the share of the held-out loss removed (negative: it rose)."""
        return (self.before - self.after) / self.before if math.isfinite(self.after) else -math.inf


def pick_rate(points: Sequence[RatePoint], min_drop: float = MIN_DROP, best_share: float = BEST_SHARE
              ) -> float | None:
    """The largest rate below the first one that rises that lowers the held-out loss clearly (module docstring);
    None when no rate does."""
    ordered = sorted(points, key=lambda p: p.lr)
    below: list[RatePoint] = []
    for p in ordered:
        if p.rises:
            break
        below.append(p)
    if not below:
        return None
    bar = max(min_drop, best_share * max(p.drop for p in below))
    clear = [p for p in below if p.drop >= bar]
    return clear[-1].lr if clear else None


@dataclass(frozen=True)
class RangeSpec:
    """What the range test runs: `steps` updates of `batch` demonstrations at each of `rates`, scored on `heldout`
    demonstrations kept out of the training draws."""

    rates: tuple[float, ...] = GRID
    steps: int = 4
    batch: int = 8
    heldout: int = 8
    seed: int = 0
    stop_at_rise: bool = True
    """Skip the rates above the first that rises (they cannot be picked): the test costs less."""


def run_range(model: torch.nn.Module, demos: list[Trajectory], t: TrainerConfig, spec: RangeSpec, pad_id: int,
              par: Parallel | None = None, on_point: Callable[[RatePoint], None] | None = None) -> list[RatePoint]:
    """Measure each of `spec.rates` from `model`'s current weights, which it has again on return.

    Every rank calls it alike under data parallelism (the same draws; `warm_start_step` and `demo_fit` are collectives).
    Only the trainable parameters are copied and put back (the frozen ones never change): one more copy of them.
    Constant rate, no warm-up: the peak rate is what breaks a model, and the warm-up only lowers the first steps'.
    """
    par = par or Parallel()
    if len(demos) < 2:
        raise ValueError(f"the range test needs at least 2 demonstrations (got {len(demos)})")
    rng = random.Random(spec.seed)
    held = rng.sample(demos, min(spec.heldout, len(demos) // 2))
    ids = {d.traj_id for d in held}
    train = [d for d in demos if d.traj_id not in ids]
    draws = [rng.sample(train, min(spec.batch, len(train))) for _ in range(spec.steps)]  # the same for every rate
    trainable = [(p, p.detach().clone()) for p in model.parameters() if p.requires_grad]
    before = demo_fit(model, held, pad_id).loss
    points: list[RatePoint] = []
    try:
        for lr in sorted(spec.rates):
            opt = torch.optim.AdamW([p for p, _ in trainable], lr=lr, weight_decay=0.0)
            model.train()
            losses = tuple(warm_start_step(model, opt, collate(d, [0.0] * len(d), pad_id), t, par)["sft_loss"]
                           for d in draws)
            point = RatePoint(lr, losses, before, demo_fit(model, held, pad_id).loss)
            points.append(point)
            if on_point is not None:
                on_point(point)
            with torch.no_grad():
                for p, saved in trainable:
                    p.copy_(saved)
            del opt
            if point.rises and spec.stop_at_rise:
                break
    finally:
        with torch.no_grad():
            for p, saved in trainable:
                p.copy_(saved)
    return points


def format_table(points: Sequence[RatePoint], picked: float | None) -> str:
    """The measurements, one rate a line: train loss per step, held-out loss before -> after, the verdict."""
    lines = [f"{'rate':>9}  {'train loss per step':<32} {'held-out before -> after':>25}  {'drop':>6}"]
    for p in sorted(points, key=lambda x: x.lr):
        steps = " ".join(f"{x:.3f}" for x in p.train_losses)
        mark = "  <- picked" if picked is not None and p.lr == picked else ("  rises" if p.rises else "")
        lines.append(f"{p.lr:9.3g}  {steps:<32} {p.before:12.4f} -> {p.after:9.4f}  {p.drop:6.1%}{mark}")
    return "\n".join(lines)


def rl_rate(warm_start_lr: float) -> float:
    """The RL rate that goes with a warm-start rate (`RL_FRACTION`), to 2 significant digits."""
    return float(f"{warm_start_lr * RL_FRACTION:.2g}")


def no_rate_message(points: Sequence[RatePoint], where: str) -> str:
    return (f"{where}: no learning rate of the range test lowered the held-out demonstrations' loss clearly (by "
            f"{MIN_DROP:.0%} of it and half the best drop) before one raised it:\n{format_table(points, None)}\n"
            "try lower rates (python -m jobs.lr_range --low ...), more steps, or set trainer.warm_start_lr to a number")


def auto_rates(model: torch.nn.Module, demos: list[Trajectory], t: TrainerConfig, pad_id: int, par: Parallel,
               seed: int) -> TrainerConfig:
    """`t` with `warm_start_lr: auto` measured on `demos` by the range test (`run_range`, `pick_rate`; the hub's pick on
    every rank) and `lr: auto` set to `RL_FRACTION` of the warm start's rate. A few steps of a few demonstrations
    per rate: as many steps as the warm start takes, at most `RangeSpec.steps`."""
    warm_start_lr = t.warm_start_lr
    if warm_start_lr == "auto":
        spec = RangeSpec(steps=max(1, min(t.warm_start_steps, RangeSpec.steps)),
                         batch=min(t.warm_start_batch, RangeSpec.batch), seed=seed)
        log.info("trainer.warm_start_lr=auto: range test of %d rates (%g..%g), %d steps of %d demonstrations each",
                 len(spec.rates), min(spec.rates), max(spec.rates), spec.steps, spec.batch)
        points = run_range(model, demos, t, spec, pad_id, par)
        picked = par.broadcast_object(pick_rate(points))
        if picked is None:
            raise WarmStartDiverged(no_rate_message(points, "trainer.warm_start_lr=auto"))
        log.info("trainer.warm_start_lr=auto picked %g:\n%s", picked, format_table(points, picked))
        warm_start_lr = picked
    lr = rl_rate(float(warm_start_lr)) if t.lr == "auto" else t.lr
    if t.lr == "auto":
        log.info("trainer.lr=auto: %g (%.3g x trainer.warm_start_lr %g)", lr, RL_FRACTION, warm_start_lr)
    return replace(t, warm_start_lr=float(warm_start_lr), lr=lr)


def rl_lr(t: TrainerConfig) -> float:
    """The rate to build the RL optimizer with: `t.lr`, or for `lr: auto` `RL_FRACTION` x a numeric `warm_start_lr`.
    With both auto and no warm start to measure (a resumed run) a stand-in: the checkpoint's optimizer state replaces
    it with the rate the run measured."""
    if t.lr != "auto":
        return float(t.lr)
    return rl_rate(float(t.warm_start_lr)) if t.warm_start_lr != "auto" else 0.0
