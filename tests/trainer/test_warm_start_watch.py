"""The warm start watches its own loss: one that makes the model worse at its own demonstrations stops the run with
a message naming trainer.warm_start_lr; a healthy one is left alone. Hand-computed bars (the numbers seen on a base model
under the smollm2-135m preset, and SmolLM2-Instruct's healthy warm start), then a real model at a rate that
diverges and at one that learns."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentrl.config import TrainerConfig
from agentrl.monitor.tensorboard import NullMonitor
from agentrl.trainer.batch import collate
from agentrl.trainer.loss_watch import DemoFit, WarmStartDiverged, check_end, check_step
from agentrl.trainer.model_load import load_model
from agentrl.trainer.step import warm_start_step
from agentrl.trainer.warm_start import WarmStart
from agentrl.types import Status, Trajectory, TrajectoryBuilder
from tests.trainer.scripted_batches import scripted_model


def test_the_bars_by_hand() -> None:
    seen_base = [(1.39, 0.84), (2.61, 0.70), (4.05, 0.58), (5.62, 0.49)]  # a base model at warm_start_lr 3e-4
    first = {"sft_loss": seen_base[0][0], "sft_token_acc": seen_base[0][1]}
    check_step(first, {"sft_loss": 2.61, "sft_token_acc": 0.7}, 2, 3e-4)  # 2.61 < 2 x 1.39 + 0.5 = 3.28
    with pytest.raises(WarmStartDiverged, match=r"rose from 1.390 to 4.050 \(token accuracy 0.84 -> 0.58\) in 3 "
                                                r"step\(s\) at trainer.warm_start_lr=0.0003: .* Lower trainer.warm_start_lr"):
        check_step(first, {"sft_loss": 4.05, "sft_token_acc": 0.58}, 3, 3e-4)
    with pytest.raises(WarmStartDiverged, match="rose from 1.390 to 5.620 .* trainer.warm_start_lr=0.0003"):
        check_end(DemoFit(1.39, 0.84), DemoFit(5.62, 0.49), 4, 3e-4)
    check_end(DemoFit(0.80, 0.80), DemoFit(0.06, 0.99), 4, 3e-4)  # SmolLM2-Instruct, chatml-tools: healthy
    check_end(DemoFit(0.80, 0.80), DemoFit(1.04, 0.79), 4, 3e-4)  # < 1.25 x 0.80 + 0.05 = 1.05: noise, not harm
    with pytest.raises(WarmStartDiverged):
        check_end(DemoFit(0.80, 0.80), DemoFit(1.06, 0.75), 4, 3e-4)


def _demos(n: int) -> list[Trajectory]:
    """Demonstrations with one learnable answer: the action repeats the context's last two tokens."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        ctx = torch.randint(5, 250, (6,), generator=g).tolist()
        b = TrajectoryBuilder()
        b.add_context(ctx)
        b.add_action(ctx[-2:] + [7], [0.0] * 3, 0, 0)
        out.append(b.build(traj_id=f"d{i}", task="lookup", index=str(i), group_id=f"g{i}", reward=1.0,
                           status=Status.COMPLETED, num_turns=1, metrics={"success": 1.0}))
    return out


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    """A model that already does what the demonstrations show (a pretrained model's state, in miniature)."""
    model_dir = scripted_model(tmp_path_factory.mktemp("watch") / "model")
    model = load_model(model_dir, 1)
    demos = _demos(64)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(60):
        stats = warm_start_step(model, opt, collate(demos, [0.0] * len(demos), 1), TrainerConfig())
    assert stats["sft_loss"] < 0.2
    return model_dir, {k: v.clone() for k, v in model.state_dict().items()}


def _warm_start(fitted, warm_start_lr: float) -> WarmStart:
    model = load_model(fitted[0], 1)
    model.load_state_dict(fitted[1])
    return WarmStart(model, _demos(64), TrainerConfig(warm_start_steps=4, warm_start_lr=warm_start_lr, warm_start_batch=16, warm_start_warmup_steps=0),
                     0, 1)


def test_a_warm_start_that_makes_the_model_worse_stops_the_run_naming_the_learning_rate(fitted) -> None:
    """Seen here: loss 0.07 -> 1.27 at the second step at 1e-2 (token accuracy 1.00 -> 0.69 after four)."""
    with pytest.raises(WarmStartDiverged, match=r"rose from 0.0\d+ to .* at trainer.warm_start_lr=0.01: .*Lower trainer.warm_start_lr"):
        _warm_start(fitted, 1e-2).run(NullMonitor())


def test_a_healthy_warm_start_is_left_alone(fitted) -> None:
    assert _warm_start(fitted, 1e-3).run(NullMonitor())["sft_steps_done"] == 4.0
