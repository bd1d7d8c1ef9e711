"""The control run (`trainer.update=warm_start`: the warm start continued instead of RL) is refused on resume from a
checkpoint without the warm start's state, on either schedule (one trainer role runs both). The asynchronous
trainer used to drop its warm start on resume and train RL instead, silently, while `jobs.train` restarts a dead
pipeline by itself. (A checkpoint with that state resumes it: tests/trainer/test_warm_start_fork.py.)"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.models import tiny
from agentrl.monitor.tensorboard import NullMonitor
from agentrl.trainer import role


@pytest.fixture
def resumed_control_run(tmp_path: Path, lookup_tokenizer) -> tuple[Path, Path]:
    model = tiny.save(tiny.build_model(lookup_tokenizer, 64, 1, 1, 128, 256, seed=0), lookup_tokenizer,
                      tmp_path / "model")
    ckpt = tmp_path / "run" / "ckpt" / "step-3"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer.json").write_text(json.dumps({"step": 3, "policy_version": 3, "consumed": [], "stats": {}}))
    return tmp_path / "run", model


@pytest.mark.parametrize("schedule", ["sync", "async"])
def test_a_resumed_control_run_is_refused(resumed_control_run, schedule: str) -> None:
    run_dir, model_dir = resumed_control_run
    cfg = load_config("demo", ["trainer.update=warm_start", f"cluster.schedule={schedule}", "trainer.threads=1"])
    with pytest.raises(ValueError, match=r"trainer.update=warm_start \(the control run\) .* holds no warm-start state"):
        role.run(run_dir, model_dir, cfg, NullMonitor(),
                 channel_factory=lambda version: pytest.fail("a refused run opens no channel"))


def _demos(n: int) -> list:
    from agentrl.types import Status, TrajectoryBuilder

    out = []
    for i in range(n):
        b = TrajectoryBuilder()
        b.add_context([1, 2, 3])
        b.add_action([4, 5], [-0.1, -0.2], 0, 0)
        out.append(b.build(traj_id=f"d{i}", task="lookup", index=str(i), group_id=f"g{i}", reward=1.0,
                           status=Status.COMPLETED, num_turns=1, metrics={"success": 1.0}))
    return out


def test_control_steps_take_control_batch_demonstrations_and_warm_start_steps_warm_start_batch(monkeypatch) -> None:
    """A control that matches the RL step's batch must not also get a bigger warm start than the RL run it is
    compared with: `control_batch` sizes only the steps after the warm start."""
    import torch

    from agentrl.config import TrainerConfig
    from agentrl.trainer import learner, warm_start

    sizes: list[int] = []
    monkeypatch.setattr(warm_start, "collate", lambda picked, rewards, pad: sizes.append(len(picked)) or picked)
    monkeypatch.setattr(warm_start, "warm_start_step", lambda model, opt, batch, t, par: {"sft_loss": 0.0, "sft_token_acc": 1.0})
    monkeypatch.setattr(warm_start, "demo_fit", lambda model, demos, pad: warm_start.DemoFit(0.0, 1.0))
    t = TrainerConfig(warm_start_steps=2, warm_start_batch=4, control_batch=8, update="warm_start", warm_start_warmup_steps=0)
    warm = warm_start.WarmStart(torch.nn.Linear(2, 2), _demos(20), t, 0, 0)
    warm.run(NullMonitor())
    assert sizes == [4, 4]
    control = type("Control", (), {"control": True, "warm": warm, "t": t})()
    learner.Learner.update(control, [], [])
    assert sizes == [4, 4, 8]
    learner.Learner.update(type("Control", (), {"control": True, "warm": warm, "t": TrainerConfig(warm_start_batch=4)})(),
                           [], [])
    assert sizes == [4, 4, 8, 4]  # control_batch 0: warm_start_batch
