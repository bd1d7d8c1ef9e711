"""The learning-rate range test: its rule on hand-made loss curves, the runner on a tiny model (fresh weights for every
rate, the same draws, the weights given back), `trainer.warm_start_lr: auto` in the warm start, and `jobs.lr_range` on a
stand-in of SmolLM2's family under the smollm2-135m preset (the preset's own model is another: the job measures
rates, so it may run there)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from agentrl.config import TrainerConfig
from agentrl.trainer.loss_watch import WarmStartDiverged
from agentrl.trainer.lr_range import (
    GRID,
    RangeSpec,
    RatePoint,
    format_table,
    pick_rate,
    rl_lr,
    rl_rate,
    run_range,
)
from agentrl.trainer.model_load import load_model
from agentrl.trainer.warm_start import WarmStart
from agentrl.types import Status, Trajectory, TrajectoryBuilder
from tests.trainer.scripted_batches import scripted_model
from tests.trainer.test_warm_start_watch import _demos


def _curve(*after: float, before: float = 1.0, rates: tuple[float, ...] = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
           ) -> list[RatePoint]:
    return [RatePoint(lr, (before,), before, a) for lr, a in zip(rates, after)]


@pytest.mark.parametrize(("after", "picked", "why"), [
    ((0.95, 0.7, 0.4, 1.5, 9.0), 1e-3, "the largest that lowers it before the first rise"),
    ((0.95, 0.7, 0.4, 0.35, 9.0), 1e-2, "a smaller drop than the best, but more than half of it"),
    ((0.9, 0.1, 0.6, 1.5, 9.0), 1e-4, "1e-3 lowers it by 0.4, less than half the best drop (0.9): past the range"),
    ((0.8, 1.3, 0.2, 0.1, 0.1), 1e-5, "a rate above the first rise is out, however low its loss"),
    ((0.99, 0.97, 0.95, 0.92, 1.5), None, "no drop reaches 10%"),
    ((1.5, 0.5, 0.5, 0.5, 0.5), None, "the smallest rate already rises"),
    ((0.9, 0.5, math.nan, 0.2, 0.2), 1e-4, "a loss that is not finite rises"),
    ((1.01, 0.5, 0.3, 1.019, 1.5), 1e-3, "1% and 1.9% above the start are noise, not rises (2%)"),
])
def test_the_rule_on_hand_made_curves(after, picked, why) -> None:
    points = _curve(*after)
    assert pick_rate(points) == picked, why
    assert pick_rate(list(reversed(points))) == picked, "the order given does not matter"


def test_the_defaults() -> None:
    assert GRID == (1e-6, 3.16e-6, 1e-5, 3.16e-5, 1e-4, 3.16e-4, 1e-3, 3.16e-3, 1e-2)
    assert rl_rate(1e-3) == 5e-5  # SmolLM2-135M: the range test's 1e-3, RL's measured 5e-5
    assert rl_lr(TrainerConfig(lr="auto", warm_start_lr=1e-3)) == 5e-5
    assert rl_lr(TrainerConfig(lr=2e-6, warm_start_lr="auto")) == 2e-6
    table = format_table(_curve(0.95, 0.7, 0.4, 1.5), 1e-3)
    assert "0.001  1.000" in table and "<- picked" in table.splitlines()[3] and "rises" in table.splitlines()[4]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return scripted_model(tmp_path_factory.mktemp("lr_range") / "model")


def test_the_range_test_on_a_tiny_model(tiny) -> None:
    """Seen here: held-out 5.668 -> 5.668 at 1e-5, 5.06 at 1e-2 (10.6%), 17.4 at 1 (a rise): 1e-2 is picked, 10 is
    never tried, and the model leaves with the weights it came with."""
    model = load_model(tiny, 1)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    spec = RangeSpec(rates=(10.0, 1e-5, 1e-2, 1.0), steps=8, batch=16)
    seen: list[float] = []
    points = run_range(model, _demos(48), TrainerConfig(), spec, 1, on_point=lambda p: seen.append(p.lr))
    assert seen == [1e-5, 1e-2, 1.0], "lowest first, stopped at the first rise"
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in start.items()), "weights given back"
    assert len({p.before for p in points}) == 1 and all(len(p.train_losses) == 8 for p in points)
    low, mid, high = points
    assert abs(low.drop) < 0.01 and mid.drop > 0.08 and high.rises
    assert pick_rate(points) == 1e-2
    again = run_range(model, _demos(48), TrainerConfig(), RangeSpec(rates=(1e-2,), steps=8, batch=16), 1)
    assert again[0] == mid, "each rate starts from the same weights with the same draws"


def _constant_demos(n: int) -> list[Trajectory]:
    """Demonstrations whose action is always the same three tokens: learnt in a few steps at a fitting rate (seen:
    held-out 5.675 -> 3.72 in 4 steps of 8 at 1e-2, 0.96 at 0.1, 15.6 at 1)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        b = TrajectoryBuilder()
        b.add_context(torch.randint(5, 250, (6,), generator=g).tolist())
        b.add_action([7, 8, 9], [0.0] * 3, 0, 0)
        out.append(b.build(traj_id=f"c{i}", task="lookup", index=str(i), group_id=f"g{i}", reward=1.0,
                           status=Status.COMPLETED, num_turns=1, metrics={"success": 1.0}))
    return out


def test_sft_lr_auto_is_measured_at_the_start_of_the_warm_start(tiny, caplog) -> None:
    t = TrainerConfig(warm_start_steps=4, warm_start_lr="auto", lr="auto", warm_start_batch=16, warm_start_warmup_steps=0)
    with pytest.raises(WarmStartDiverged, match=r"(?s)trainer.warm_start_lr=auto: no learning rate .*\n +rate .*set "
                                                r"trainer.warm_start_lr to a number"):
        WarmStart(load_model(tiny, 1), _demos(48), t, 0, 1)  # copying from scratch: 4 steps teach it too little
    with caplog.at_level("INFO", logger="agentrl.trainer"):
        warm = WarmStart(load_model(tiny, 1), _constant_demos(48), t, 0, 1)
    assert warm.t.warm_start_lr == 1e-2, "34% of the loss gone at 1e-2 (the grid's top); 3.16e-3's 16.5% is under half"
    assert warm.t.lr == rl_rate(warm.t.warm_start_lr) and warm.opt.param_groups[0]["lr"] == warm.t.warm_start_lr
    assert f"trainer.warm_start_lr=auto picked {warm.t.warm_start_lr:g}" in caplog.text and "<- picked" in caplog.text
    numeric = WarmStart(load_model(tiny, 1), _demos(48), TrainerConfig(warm_start_steps=4, warm_start_lr=3e-4, lr="auto"), 0, 1)
    assert (numeric.t.warm_start_lr, numeric.t.lr) == (3e-4, 1.5e-5), "a numeric warm_start_lr is kept; lr: auto follows it"
    kept = WarmStart(load_model(tiny, 1), _demos(48), TrainerConfig(warm_start_steps=4, warm_start_lr=3e-4, lr=2e-6), 0, 1)
    assert kept.t == TrainerConfig(warm_start_steps=4, warm_start_lr=3e-4, lr=2e-6), "numbers are used unchanged"


def test_jobs_lr_range_on_a_stand_in(tmp_path) -> None:
    from agentrl.models import standins
    from tests.job_cli import run_job

    model = standins.build("smollm2", tmp_path / "smol", dtype="float32")
    out = tmp_path / "lr.json"
    run = run_job("lr_range", str(model), "--preset", "smollm2-135m", "--demos", "12", "--rates", "1e-5,3e-2,30",
                  "--steps", "3", "--batch", "4", "--heldout", "4", "--json", str(out), "--full")
    rc, text = run.returncode, run.stdout
    assert rc in (0, 1), run.stderr[-2000:]
    assert "demos      12 of 12 expert episodes of lookup" in text and "freeze_layers -10" in text
    data = json.loads(out.read_text())
    assert [p["lr"] for p in data["points"]] == [1e-5, 3e-2, 30.0] and data["points"][2]["rises"]
    assert rc == (0 if data["sft_lr"] else 1)
    if data["sft_lr"]:
        assert f"trainer.warm_start_lr={data['sft_lr']:g} trainer.lr={rl_rate(data['sft_lr']):g}" in text
