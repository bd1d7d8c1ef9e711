from __future__ import annotations

import re
from pathlib import Path

import pytest

from agentrl.config import ConfigError, RunConfig, config_from_dict, dump_config, load_config


def test_demo_preset_loads_and_overrides_apply() -> None:
    cfg = load_config("demo", ["trainer.lr=1e-5", "rollout.temperature=0.7", "envs.tasks=[unlock, lookup]", "name=x"])
    assert cfg.trainer.lr == pytest.approx(1e-5)
    assert cfg.rollout.temperature == pytest.approx(0.7)
    assert cfg.envs.tasks == ("unlock", "lookup")
    assert cfg.name == "x" and cfg.run_dir == Path("runs/x")
    assert cfg.rollout.group_size == 8  # from the preset, not the dataclass default
    with pytest.raises(AttributeError):
        cfg.trainer.lr = 1.0  # type: ignore[misc]  # frozen


def test_resolved_config_round_trips_through_yaml(tmp_path: Path) -> None:
    cfg = load_config("demo", ["algo.kl_coef=0.001"])
    dump_config(cfg, tmp_path / "config.yaml")
    assert load_config(str(tmp_path / "config.yaml")) == cfg


@pytest.mark.parametrize("override, field", [
    ("trainer.lr=-1", "trainer.lr"),
    ("trainer.lr=fast", "trainer.lr"),
    ("rollout.engine=tgi", "rollout.engine"),
    ("algo.dual_clip=0.5", "algo.dual_clip"),
    ("model.num_heads=4", "model.num_heads"),  # head_dim 32 < 64
    ("rollout.max_new_tokens=4096", "rollout.max_new_tokens"),
    ("trainer.lrr=1e-5", "trainer.lrr"),
    ("envs.tasks=[]", "envs.tasks"),
    ("algo.task_norm=3", "algo.task_norm"),
    ("trainer.steps=2.5", "trainer.steps"),
    ("nosection.x=1", "nosection"),
    ("transport.channel=tcp", "transport.channel"),
])
def test_bad_values_fail_at_load_naming_the_field(override: str, field: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config("demo", [override])
    assert str(e.value).startswith(field), str(e.value)


def test_unknown_preset_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="demo"):
        load_config("no-such-preset")


def test_defaults_are_valid() -> None:
    assert config_from_dict({}) == RunConfig()


def test_override_needs_equals() -> None:
    with pytest.raises(ConfigError, match="section.field=value"):
        load_config("demo", ["trainer.lr"])


@pytest.mark.parametrize("overrides, field", [
    (["trainer.warm_start_steps=10", "rollout.expert_samples=0"], "rollout.expert_samples"),
    (["rollout.group_size=1"], "rollout.group_size"),
    (["rollout.max_model_len=4096"], "rollout.max_model_len"),
    (["rollout.top_p=0.9"], "rollout.top_p"),
    (["name=.."], "name"),
    (["transport.channel=files", "transport.weights=broadcast"], "transport.channel"),
])
def test_fields_that_only_make_sense_together(overrides: list[str], field: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config("demo", overrides)
    assert str(e.value).startswith(field), str(e.value)


def test_numbers_typed_on_the_command_line_stay_text_in_string_fields() -> None:
    cfg = load_config("smoke", ["model.path=3.10", "trainer.lr=1e-5", "trainer.warm_start_target=1",
                               "envs.task_options.lookup.expert_skill=0.25"])
    assert cfg.model.path == "3.10" and type(cfg.model.path) is str  # not 3.1
    assert cfg.trainer.lr == 1e-5 and isinstance(cfg.trainer.lr, float)
    assert cfg.trainer.warm_start_target == 1.0
    assert cfg.envs.task_options["lookup"]["expert_skill"] == 0.25  # a number for the task, not the text
    with pytest.raises(ConfigError, match="trainer.steps: expected an integer"):
        load_config("demo", ["trainer.steps=1.5"])


def test_a_yaml_file_string_that_looks_like_a_number_stays_a_string(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text('name: "2.50"\ntrainer:\n  lr: 1e-5\n')
    cfg = load_config(str(tmp_path / "p.yaml"))
    assert cfg.name == "2.50" and cfg.trainer.lr == 1e-5
    dump_config(cfg, tmp_path / "config.yaml")
    assert load_config(str(tmp_path / "config.yaml")) == cfg


def test_the_synchronous_schedule_is_the_pipeline_with_fixed_numbers() -> None:
    """`RunConfig.pipeline` works out every derived number once: the baseline's are fixed (max_staleness 0,
    drain, exactly one step's groups), the asynchronous schedule's follow `transport` and `algo`."""
    # the demo preset's algo.max_staleness is 1: the baseline of any preset is `cluster.schedule=sync` alone
    sync = load_config("demo", ["cluster.schedule=sync", "transport.inflight=swap"]).pipeline
    step_groups = 8 * 2  # the demo's groups_per_task x its two tasks
    assert (sync.max_staleness, sync.inflight, sync.min_groups, sync.max_groups) == (0, "drain", step_groups,
                                                                                     step_groups)
    asy = load_config("demo", ["algo.max_staleness=2", "transport.max_groups=40", "transport.inflight=abort",
                               "cluster.rollout.lagging_engines_per_rank=1", "rollout.lagging_prob=0.5",
                               "cluster.rollout.lagging_refresh_steps=5"]).pipeline
    assert (asy.max_staleness, asy.inflight, asy.min_groups, asy.max_groups) == (2, "abort", step_groups, 40)
    assert asy.lagging_max_staleness == 2 + 5 and asy.capacity == 4 * 40 * asy.group_size


@pytest.mark.parametrize("overrides, field", [
    (["cluster.schedule=sync", "transport.min_groups=3"], "transport.min_groups: min_groups and max_groups must be 0"),
    (["cluster.schedule=sync", "cluster.rollout.ranks=2"], "cluster.rollout.ranks: the synchronous schedule runs one"),
    (["cluster.hetjob=false"], "cluster.hetjob: false (one job per role) needs transport.channel=files"),
    (["transport.queue_capacity=3"], "transport.queue_capacity: must be 0 or >= min_groups x"),
])
def test_contradictions_of_the_schedule_fail_at_load_naming_the_field(overrides: list[str], field: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(field)):
        load_config("demo", overrides)


def test_a_renamed_key_is_read_under_its_new_name_with_a_warning(caplog) -> None:
    """`typed.RENAMED`: an old key from the command line or a YAML file loads as the new one; the warning names
    the new key (tests/launch/test_renamed_keys.py: run dirs written before the rename)."""
    new = load_config("smoke", ["rollout.group_size=3", "rollout.groups_per_task=5", "trainer.warm_start_lr=1e-3",
                                "trainer.update=warm_start"])
    with caplog.at_level("WARNING", logger="agentrl.config"):
        old = load_config("smoke", ["rollout.samples_per_prompt=3", "rollout.prompts_per_step=5",
                                    "trainer.sft_lr=1e-3", "trainer.update=sft"])
    assert old == new and old.trainer.update == "warm_start"
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("the command line: old names read under their new ones:")
    for said in ("rollout.samples_per_prompt as rollout.group_size", "rollout.prompts_per_step as "
                 "rollout.groups_per_task", "trainer.sft_lr as trainer.warm_start_lr",
                 "trainer.update=sft as trainer.update=warm_start"):
        assert said in line
    # a preset's key (here the new name) is overridden by the command line's, under either name
    assert load_config("smoke", ["trainer.sft_steps=9"]).trainer.warm_start_steps == 9


def test_a_key_set_under_its_old_and_its_new_name_fails_naming_both(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^trainer.sft_steps, trainer.warm_start_steps: the command line sets both"):
        load_config("smoke", ["trainer.sft_steps=3", "trainer.warm_start_steps=4"])
    (tmp_path / "p.yaml").write_text("rollout: {samples_per_prompt: 4, group_size: 4}\n")
    with pytest.raises(ConfigError, match=r"^rollout.samples_per_prompt, rollout.group_size: .*p.yaml sets both"):
        load_config(str(tmp_path / "p.yaml"))
    with pytest.raises(ConfigError, match=r"rollout.prompts_per_step, rollout.groups_per_task: the config sets both"):
        config_from_dict({"rollout": {"prompts_per_step": 2, "groups_per_task": 2}})
    with pytest.raises(ConfigError, match="trainer.update: unknown value 'imitate'"):  # only the listed old values
        load_config("smoke", ["trainer.update=imitate"])
