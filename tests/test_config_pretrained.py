"""Learning rates keyed to where the model comes from: the tiny model trained from scratch keeps the defaults it
was tuned with; a pretrained `model.path` gets `PRETRAINED_DEFAULTS` where nothing sets them; a preset written
for the tiny model, run with a pretrained model.path, fails at load naming the fields it tuned (never silently)."""
from __future__ import annotations

import pytest

from agentrl.config import PRETRAINED_DEFAULTS, ConfigError, TrainerConfig, dump_config, load_config


def test_the_tiny_model_keeps_its_from_scratch_rates() -> None:
    cfg = load_config(None)
    assert (cfg.trainer.lr, cfg.trainer.warm_start_lr) == (TrainerConfig().lr, TrainerConfig().warm_start_lr) == (1e-4, 3e-3)
    demo = load_config("demo")
    assert (demo.trainer.lr, demo.trainer.warm_start_lr, demo.trainer.warm_start_all_tokens) == (1e-3, 3e-3, True)


def test_a_pretrained_model_path_gets_pretrained_rates_where_none_is_set(tmp_path) -> None:
    for preset in (None, "smoke"):
        cfg = load_config(preset, ["model.path=/models/mine"])
        assert cfg.trainer.lr == PRETRAINED_DEFAULTS["trainer.lr"] == 1e-6
        assert cfg.trainer.warm_start_lr == PRETRAINED_DEFAULTS["trainer.warm_start_lr"] == 1e-5
    cfg = load_config("smoke", ["model.path=/models/mine", "trainer.warm_start_lr=3e-5"])
    assert (cfg.trainer.lr, cfg.trainer.warm_start_lr) == (1e-6, 3e-5)  # what is set stays set
    dump_config(cfg, tmp_path / "config.yaml")  # a run dir's resolved config reads back the same
    assert load_config(str(tmp_path / "config.yaml")) == cfg


def test_a_tiny_model_preset_with_a_pretrained_path_names_the_fields_it_tuned() -> None:
    with pytest.raises(ConfigError) as e:
        load_config("demo", ["model.path=/models/mine"])
    msg = str(e.value)
    assert msg.startswith("trainer.lr, trainer.warm_start_lr, trainer.warm_start_all_tokens: preset 'demo' sets trainer.lr=0.001, "
                          "trainer.warm_start_lr=0.003, trainer.warm_start_all_tokens=True for the tiny model"), msg
    assert "model.path=/models/mine" in msg and "smollm2-135m" in msg
    with pytest.raises(ConfigError, match="^trainer.warm_start_all_tokens: preset 'demo'"):
        load_config("demo", ["model.path=/models/mine", "trainer.lr=1e-6", "trainer.warm_start_lr=1e-5"])
    cfg = load_config("demo", ["model.path=/models/mine", "trainer.lr=1e-6", "trainer.warm_start_lr=1e-5",
                               "trainer.warm_start_all_tokens=false"])
    assert (cfg.trainer.lr, cfg.trainer.warm_start_lr, cfg.trainer.warm_start_all_tokens) == (1e-6, 1e-5, False)


def test_the_pretrained_presets_set_rates_of_their_own() -> None:
    q = load_config("agentbench-qwen2.5-7b")
    assert q.trainer.lr == 1e-6
    s = load_config("smollm2-135m")
    assert s.model.chat_template == "chatml-tools" and s.trainer.warm_start_lr < 1e-3 and s.trainer.lr < 1e-3
    here = load_config("smollm2-135m", ["model.path=/scratch/me/SmolLM2-135M-Instruct"])  # its model, copied
    assert (here.trainer.lr, here.trainer.warm_start_lr) == (s.trainer.lr, s.trainer.warm_start_lr)  # its own, kept


def test_a_pretrained_preset_on_another_model_names_the_rates_it_tuned() -> None:
    """A preset's rates were chosen for its own model.path: on another model they must be set again (auto measures
    them), never silently carried (a base model under smollm2-135m's warm_start_lr 3e-4 went from loss 1.39 to 5.62)."""
    with pytest.raises(ConfigError) as e:
        load_config("smollm2-135m", ["model.path=/models/gemma-3-270m"])
    msg = str(e.value)
    assert msg.startswith("trainer.lr, trainer.warm_start_lr: preset 'smollm2-135m' sets trainer.lr=5e-05, "
                          "trainer.warm_start_lr=0.0003 for its own model (models/SmolLM2-135M-Instruct)"), msg
    assert "trainer.warm_start_lr=auto trainer.lr=auto" in msg and "jobs.lr_range /models/gemma-3-270m" in msg
    with pytest.raises(ConfigError, match="^trainer.lr: preset 'smollm2-135m' sets trainer.lr=5e-05 "):
        load_config("smollm2-135m", ["model.path=/models/gemma-3-270m", "trainer.warm_start_lr=auto"])
    cfg = load_config("smollm2-135m", ["model.path=/models/gemma-3-270m", "trainer.warm_start_lr=auto", "trainer.lr=2e-6"])
    assert (cfg.trainer.warm_start_lr, cfg.trainer.lr) == ("auto", 2e-6)
    # a tool that trains nothing (a format check, an evaluation) may run the preset's settings on another model
    assert load_config("smollm2-135m", ["model.path=/models/gemma-3-270m"], trains=False).trainer.lr == 5e-5


@pytest.mark.parametrize(("value", "want"), [("auto", "auto"), ("1e-5", 1e-5), ("0.0003", 3e-4)])
def test_the_rates_take_a_number_or_auto(value: str, want: object) -> None:
    cfg = load_config("smoke", [f"trainer.warm_start_lr={value}", f"trainer.lr={value}"])
    assert cfg.trainer.warm_start_lr == cfg.trainer.lr == want


@pytest.mark.parametrize(("overrides", "error"), [
    (["trainer.warm_start_lr=fast"], "trainer.warm_start_lr: expected a number or auto, got 'fast'"),
    (["trainer.lr=true"], "trainer.lr: expected a number or auto, got True"),
    (["trainer.warm_start_lr=-1e-5"], "trainer.warm_start_lr: must be positive"),
    (["trainer.lr=auto", "trainer.warm_start_lr=auto", "trainer.warm_start_steps=0"], "trainer.lr: auto with warm_start_lr auto"),
])
def test_a_bad_rate_fails_at_load_naming_the_field(overrides: list[str], error: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config("smoke", overrides)
    assert str(e.value).startswith(error), e.value


def test_auto_rates_read_back_from_a_run_dir(tmp_path) -> None:
    cfg = load_config("smoke", ["trainer.warm_start_lr=auto", "trainer.lr=auto"])
    dump_config(cfg, tmp_path / "config.yaml")
    assert load_config(str(tmp_path / "config.yaml")) == cfg
