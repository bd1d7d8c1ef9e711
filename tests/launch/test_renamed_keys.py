"""Run dirs written before keys were renamed (`agentrl.config.typed.RENAMED`) still load, resume and fork.

data/config-before-rename.yaml is a copy of a real run dir's config.yaml (the SmolLM2 AgentBench run of seed 0),
written with the old names: `rollout.samples_per_prompt`, `rollout.prompts_per_step` and the ten `trainer.sft_*`.
"""
from __future__ import annotations

import json
from pathlib import Path

from agentrl.config import load_config
from agentrl.launch.continuing import resume_check
from agentrl.launch.fork import fork_warm_start, mismatches
from agentrl.trainer.checkpoint import WARM_FILE

OLD = Path(__file__).parent / "data" / "config-before-rename.yaml"
WARM_START = ("steps", "lr", "batch", "warmup_steps", "all_tokens", "successful_only", "target", "min_token_prob",
              "check_every", "holdout")


def _new_names(text: str) -> str:
    """The same settings under the new names, rewritten line by line (independently of the loader's table)."""
    text = text.replace("  samples_per_prompt:", "  group_size:").replace("  prompts_per_step:", "  groups_per_task:")
    for key in WARM_START:
        text = text.replace(f"  sft_{key}:", f"  warm_start_{key}:")
    return text


def _run_dir(root: Path, text: str) -> Path:
    root.mkdir(parents=True)
    (root / "config.yaml").write_text(text)
    return root


def test_the_old_keys_load_to_the_same_config_as_the_new_ones(tmp_path: Path, caplog) -> None:
    new_text = _new_names(OLD.read_text())
    assert "sft_" not in new_text and "_per_prompt" not in new_text and "_per_step" not in new_text
    (tmp_path / "new.yaml").write_text(new_text)
    with caplog.at_level("WARNING", logger="agentrl.config"):
        old = load_config(str(OLD))
    assert old == load_config(str(tmp_path / "new.yaml"))
    assert (old.rollout.groups_per_task, old.rollout.group_size) == (2, 4)
    t = old.trainer
    assert (t.warm_start_steps, t.warm_start_lr, t.warm_start_batch, t.warm_start_successful_only) == (20, 3e-4, 20,
                                                                                                       False)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"{OLD}: old names read under their new ones") and "trainer.warm_start_holdout" in line


def test_an_old_run_dir_resumes_with_a_config_under_the_new_names(tmp_path: Path) -> None:
    old_dir = _run_dir(tmp_path / "old", OLD.read_text())
    new_text = _new_names(OLD.read_text())
    (tmp_path / "new.yaml").write_text(new_text)
    assert resume_check(old_dir, load_config(str(tmp_path / "new.yaml"))) is None
    longer = new_text.replace("  steps: 12\n", "  steps: 30\n")  # trainer.steps: more steps extend the run
    (tmp_path / "longer.yaml").write_text(longer)
    assert resume_check(old_dir, load_config(str(tmp_path / "longer.yaml"))) is None
    (tmp_path / "other.yaml").write_text(new_text.replace("  warm_start_lr: 0.0003\n", "  warm_start_lr: 0.001\n"))
    why = resume_check(old_dir, load_config(str(tmp_path / "other.yaml")))
    assert why == "its config differs in trainer.warm_start_lr (0.0003 -> 0.001)"
    # a control run written as `update: sft` continues as `update: warm_start`
    control = OLD.read_text().replace("  update: rl\n", "  update: sft\n")
    control_dir = _run_dir(tmp_path / "control", control)
    assert load_config(str(control_dir / "config.yaml")).trainer.update == "warm_start"
    (tmp_path / "control.yaml").write_text(_new_names(control).replace("  update: sft\n", "  update: warm_start\n"))
    assert resume_check(control_dir, load_config(str(tmp_path / "control.yaml"))) is None


def test_a_new_control_run_forks_the_warm_start_of_an_old_run_dir(tmp_path: Path) -> None:
    """`trainer.warm_start_from` an RL run written under the old names: its settings are compared under the new
    ones (`fork.MAY_DIFFER` names the new keys), so the control (`update=warm_start`) shares its warm start."""
    src = _run_dir(tmp_path / "s0-t2", OLD.read_text())
    step0 = src / "ckpt" / "step-0"
    (step0 / "state").mkdir(parents=True)
    (step0 / "trainer.json").write_text(json.dumps({"step": 0}))
    (step0 / WARM_FILE).write_text(json.dumps({"done": 20}))
    (src / "shards" / "expert-0").mkdir(parents=True)
    (tmp_path / "new.yaml").write_text(_new_names(OLD.read_text()))
    cfg = load_config(str(tmp_path / "new.yaml"), ["name=s0-t2-control", f"run_root={tmp_path}",
                                                   "trainer.update=warm_start", f"trainer.warm_start_from={src}",
                                                   "rollout.group_size=8", "rollout.groups_per_task=1"])
    assert mismatches(load_config(str(src / "config.yaml")), cfg) == []
    dest = tmp_path / "s0-t2-control"
    dest.mkdir()
    assert "ckpt/step-0" in fork_warm_start(cfg, dest)
    other = load_config(str(tmp_path / "new.yaml"), ["name=x", f"run_root={tmp_path}", "trainer.warm_start_batch=8",
                                                     f"trainer.warm_start_from={src}"])
    assert mismatches(load_config(str(src / "config.yaml")), other) == ["trainer.warm_start_batch (20 there, 8 here)"]
