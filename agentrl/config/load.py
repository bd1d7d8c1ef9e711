"""Building a `RunConfig`: a preset (YAML) plus `a.b=value` overrides, every value checked against its field's
annotation; and writing one back (`dump_config`), which `load_config` reads to an equal config."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from agentrl.config.errors import ConfigError, _check
from agentrl.config.run import RunConfig
from agentrl.config.task_options import checked_task_options
from agentrl.config.typed import Scalar, _build, _looks_numeric, new_names

PRESETS_DIR = Path(__file__).parent.parent / "presets"


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        _check(isinstance(node, dict), dotted, "is not a section")
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """`trainer.lr=1e-5` → ("trainer.lr", 1e-5); the value is read as a YAML scalar or list, and a scalar
    that reads as a number keeps its text for string fields (see `Scalar`)."""
    if "=" not in text:
        raise ConfigError(f"{text}: override must look like section.field=value")
    key, raw = text.split("=", 1)
    key = key.strip().lstrip("-")
    value = yaml.safe_load(raw) if raw.strip() else ""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number or isinstance(value, str) and _looks_numeric(value):
        value = Scalar(raw.strip(), value)
    return key, value


# Where the model comes from decides the scale of its learning rates. The dataclass defaults train our tiny
# model from scratch (a warm start at 3e-3); the same rates destroy a pretrained model within a few steps.
PRETRAINED_DEFAULTS: dict[str, Any] = {"trainer.lr": 1e-6, "trainer.warm_start_lr": 1e-5}
"""What a run from a pretrained `model.path` gets for the fields neither its preset nor its overrides set."""
SCRATCH_TUNED = ("trainer.lr", "trainer.warm_start_lr", "trainer.warm_start_all_tokens")
"""Fields a preset for the tiny model tunes to its scale: with another `model.path` they must be set again."""


def _get_dotted(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for k in dotted.split("."):
        if not isinstance(node, dict) or k not in node:
            return None
        node = node[k]
    return node


def config_from_dict(data: dict[str, Any]) -> RunConfig:
    """The config of `data` (a preset's tree with overrides). A pretrained `model.path` gets
    `PRETRAINED_DEFAULTS` for the fields `data` does not set. Renamed keys are read under their new names."""
    data = new_names(data, "the config")  # a copy, its sections too
    if _get_dotted(data, "model.path"):
        for key, value in PRETRAINED_DEFAULTS.items():
            if _get_dotted(data, key) is None:
                _set_dotted(data, key, value)
    cfg = _build(RunConfig, data, "")
    cfg.validate()
    # the task options as their dataclasses read them (a command line's `5` a number, not the text "5")
    options = checked_task_options(cfg.envs, cfg.controller)
    return dataclasses.replace(cfg, envs=dataclasses.replace(cfg.envs, task_options=options))


def _check_source(preset: str, preset_data: dict[str, Any], overrides: dict[str, Any]) -> None:
    """A preset written for the tiny model (no model.path) run with a pretrained `model.path`: the fields it tunes
    to the tiny model's scale (`SCRATCH_TUNED`) must come from the command line too, not silently from it."""
    if _get_dotted(preset_data, "model.path") or not overrides.get("model.path"):
        return
    tuned = [k for k in SCRATCH_TUNED if _get_dotted(preset_data, k) is not None and k not in overrides]
    _check(not tuned, ", ".join(tuned),
           f"preset {preset!r} sets {', '.join(f'{k}={_get_dotted(preset_data, k)}' for k in tuned)} for the tiny "
           f"model it trains from scratch; with model.path={overrides['model.path']} set them for a pretrained model "
           "(e.g. trainer.lr=1e-6 trainer.warm_start_lr=1e-5 trainer.warm_start_all_tokens=false), or use a preset "
           "that leaves them to the pretrained defaults (smoke, smollm2-135m)")


OWN_MODEL_RATES = ("trainer.lr", "trainer.warm_start_lr")
"""Fields a preset for a pretrained model tunes to that model: with another `model.path` they must be set again."""


def _same_model(a: str, b: str) -> bool:
    """The same directory, or one of the same name elsewhere (a cluster's copy: /scratch/me/Qwen2.5-7B-Instruct)."""
    pa, pb = Path(a).expanduser().resolve(), Path(b).expanduser().resolve()
    return pa == pb or pa.name.lower() == pb.name.lower()


def _check_rates_carry(preset: str, preset_data: dict[str, Any], overrides: dict[str, Any]) -> None:
    """A preset that names its own `model.path` run with another one: the learning rates it sets were chosen for
    its model and do not carry to another (a base model under smollm2-135m's warm_start_lr 3e-4 went from loss 1.39 to
    5.62 in 4 steps), so the command line must set them: `auto` measures them (`agentrl.trainer.lr_range`)."""
    own, other = _get_dotted(preset_data, "model.path"), overrides.get("model.path")
    if not own or not other or _same_model(str(own), str(other)):
        return
    tuned = [k for k in OWN_MODEL_RATES if _get_dotted(preset_data, k) not in (None, "auto") and k not in overrides]
    _check(not tuned, ", ".join(tuned),
           f"preset {preset!r} sets {', '.join(f'{k}={_get_dotted(preset_data, k)}' for k in tuned)} for its own "
           f"model ({own}); learning rates do not carry from one model to another, so with model.path={other} set "
           "them on the command line: trainer.warm_start_lr=auto trainer.lr=auto (a short range test on the warm "
           f"start's demonstrations picks them), or measure first with python -m jobs.lr_range {other} --preset "
           f"{preset} and pass the rates it prints")


def load_config(preset: str | None = None, overrides: list[str] | tuple[str, ...] = (), *,
                trains: bool = True) -> RunConfig:
    """Build the run config from a preset name (or a YAML path) and `a.b=value` overrides. `trains=False`: a tool
    that trains nothing (a format check, an evaluation) may run a preset's settings on another model without
    setting its learning rates again (`_check_rates_carry`)."""
    data: dict[str, Any] = {}
    if preset:
        path = Path(preset)
        if path.suffix not in (".yaml", ".yml"):  # a name; "agentbench-qwen2.5-7b" has a dot, not a suffix
            path = PRESETS_DIR / f"{preset}.yaml"
        if not path.exists():
            known = sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))
            raise ConfigError(f"preset: no preset {preset!r} (known: {', '.join(known)})")
        data = yaml.safe_load(path.read_text()) or {}
        _check(isinstance(data, dict), "preset", f"{path} is not a mapping")
        data = new_names(data, str(path))  # a preset or a run dir's config.yaml written before a rename
    given = new_names(dict(parse_override(item) for item in overrides), "the command line")
    if preset:
        _check_source(preset, data, given)
        if trains:
            _check_rates_carry(preset, data, given)
    for key, value in given.items():
        _set_dotted(data, key, value)
    return config_from_dict(data)


def to_dict(cfg: Any) -> dict[str, Any]:
    d = dataclasses.asdict(cfg)
    return _lists(d)


def _lists(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _lists(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [_lists(v) for v in node]
    return node


def dump_config(cfg: RunConfig, path: str | Path) -> None:
    """Write the resolved config as YAML; `load_config(path)` reads it back to an equal config."""
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
