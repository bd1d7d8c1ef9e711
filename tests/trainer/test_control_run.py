"""The control run (`trainer.update=sft`: the warm start continued instead of RL) is refused on resume, on
either schedule (one trainer role runs both). The asynchronous trainer used to drop its warm start on resume
and train RL instead, silently, while `jobs.train` restarts a dead pipeline by itself (issue 18)."""
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
    cfg = load_config("demo", ["trainer.update=sft", f"cluster.schedule={schedule}", "trainer.threads=1"])
    with pytest.raises(ValueError, match=r"trainer.update=sft \(the control run\) .* not a resumed one \(found "):
        role.run(run_dir, model_dir, cfg, NullMonitor(),
                 channel_factory=lambda version: pytest.fail("a refused run opens no channel"))
