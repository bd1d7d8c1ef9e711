"""Task options are typed where they are read: each built-in task declares them as a frozen dataclass that
mirrors its constructor, and the config loader checks them at load, naming the field."""
from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest

from agentrl.config import ConfigError, dump_config, load_config
from agentrl.config.task_options import describe_budget, message_budget_s, task_names, worker_call_timeout_s
from agentrl.evaluation.services import eval_config
from agentrl.tasks import _BUILTIN, get_task_class, options_type, task_name
from agentrl.tasks.api import NoOptions

BUILTIN = sorted(_BUILTIN)


@pytest.mark.parametrize("spec", BUILTIN)
def test_a_tasks_options_are_its_constructors_keywords(spec: str) -> None:
    cls = get_task_class(spec)
    options = options_type(spec)
    assert options is getattr(cls, "Options", NoOptions)
    assert dataclasses.is_dataclass(options) and options.__dataclass_params__.frozen  # type: ignore[attr-defined]
    params = {n: p for n, p in inspect.signature(cls).parameters.items()}
    assert [f.name for f in dataclasses.fields(options)] == list(params)
    defaults = options()
    for f in dataclasses.fields(options):
        given = params[f.name].default
        if not dataclasses.is_dataclass(getattr(defaults, f.name)):  # os's sandbox: None there, its defaults here
            assert getattr(defaults, f.name) == (tuple(given) if isinstance(given, list) else given), f.name
    assert task_name(spec) == cls.name  # known without importing the task


def test_a_bad_os_timeout_fails_at_load_naming_the_field() -> None:
    base = ["envs.tasks=[os]"]
    for value, why in (("abc", "expected a number, got 'abc'"), ("0", "must be > 0"),
                       ("30", "does not fit the agent's budget for one message, 18 s")):
        with pytest.raises(ConfigError, match=rf"^envs\.task_options\.os\.sandbox\.command_timeout_s: .*{why}"):
            load_config("smoke", [*base, f"envs.task_options.os.sandbox.command_timeout_s={value}"])
    with pytest.raises(ConfigError, match=r"^envs\.task_options\.os\.source: unknown value 'theirs'"):
        load_config("smoke", [*base, "envs.task_options.os.source=theirs"])


def test_a_command_line_option_is_read_as_its_type_and_written_back(tmp_path: Path) -> None:
    """`sandbox.command_timeout_s=5` from the command line crashed `dump_config`; now it is the number 5.0, a
    password of digits stays text, and the written config reads back equal."""
    cfg = load_config("smoke", ["envs.tasks=[os, db]", "envs.task_options.os.sandbox.command_timeout_s=5",
                                "envs.task_options.db.mariadb_password=1234"])
    assert cfg.envs.task_options == {"os": {"sandbox": {"command_timeout_s": 5.0}}, "db": {"mariadb_password": "1234"}}
    dump_config(cfg, tmp_path / "config.yaml")
    assert load_config(str(tmp_path / "config.yaml")) == cfg


def test_options_that_would_fail_in_the_worker_fail_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTRL_AGENTBENCH_DIR", raising=False)
    with pytest.raises(ConfigError, match=r"^envs\.task_options\.db\.agentbench_dir: source=agentbench reads an "
                                          r"AgentBench checkout"):
        load_config("smoke", ["envs.tasks=[db]", "envs.task_options.db.source=agentbench"])
    base = load_config("smoke", ["envs.tasks=[db]"])
    with pytest.raises(ConfigError, match=r"^envs\.task_options\.db\.agentbench_dir"):  # jobs.eval's way in
        eval_config(base, "e", "/tmp", ("db",), "strict", {"db": {"source": "agentbench"}})
    with pytest.raises(ConfigError, match=r"^envs\.task_options\.lookup\.expert_skill: must be in \[0, 1\]"):
        load_config("smoke", ["envs.task_options.lookup.expert_skill=2"])
    with pytest.raises(ConfigError, match=r"^envs\.task_options\.echo: the task 'echo' takes no options"):
        load_config("smoke", ["envs.tasks=[echo]", "envs.task_options.echo.x=1"])
    with pytest.raises(ConfigError, match=r"^envs\.tasks: cannot find the task 'nope'"):
        load_config("smoke", ["envs.tasks=[nope]"])


def test_the_message_budget_is_set_in_one_place() -> None:
    cfg = load_config("smoke", ["envs.tasks=[os]"])
    assert worker_call_timeout_s(cfg.controller) == 25.0 and message_budget_s(cfg.envs, cfg.controller) == 18.0
    tight = load_config("smoke", ["envs.tasks=[lookup]", "controller.request_timeout_s=10"])
    assert message_budget_s(tight.envs, tight.controller) == 6.0  # 3/4 of the worker's 8 s
    line = describe_budget(options_type("os")(), cfg.envs, cfg.controller)  # type: ignore[misc]
    assert line.startswith("per message 18 s") and line.endswith("within it sandbox.command_timeout_s 10 s")
    assert task_names(load_config("smoke", ["envs.tasks=[lookup, agentrl.tasks.example:GuessTask]"]).envs) == (
        "lookup", "guess")
