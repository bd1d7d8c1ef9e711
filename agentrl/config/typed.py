"""Reading a value against its field's annotation: what `load_config` builds every section with, and what a
task's options (`agentrl.config.task_options`) are checked with. Every problem is a `ConfigError` naming the
dotted field. Keys that moved (`MOVED`) fail at load naming their new place; keys and values that were renamed
(`RENAMED`, `RENAMED_VALUES`) are read under their new names (`new_names`)."""
from __future__ import annotations

import dataclasses
import logging
import types
import typing
from typing import Any, Literal

from agentrl.config.errors import ConfigError, _check

log = logging.getLogger("agentrl.config")


class Scalar(str):
    """A command-line value as typed, with what YAML reads it as (`parsed`): a string field gets the text
    ("3.10" stays "3.10"), a number field gets the number ("1e-5", which YAML 1.1 leaves a string, too)."""

    parsed: Any

    def __new__(cls, text: str, parsed: Any) -> Scalar:
        obj = super().__new__(cls, text)
        obj.parsed = parsed
        return obj

    def __reduce__(self) -> tuple[type, tuple[str, Any]]:  # copied whole (`dataclasses.asdict` deep-copies)
        return Scalar, (str(self), self.parsed)


def _looks_numeric(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def plain(value: Any) -> Any:
    """`value` with its command-line values (`Scalar`) read as YAML reads them, inside mappings and lists too."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value.parsed if isinstance(value, Scalar) else value


def _coerce(value: Any, tp: Any, path: str) -> Any:
    """Check `value` against annotation `tp` (int, float, str, bool, None, Literal[...], a union, tuple[X, ...],
    dict[K, V], Any, dataclass)."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        _check(isinstance(value, dict), path, f"expected a mapping, got {type(value).__name__}")
        return _build(tp, value, path)
    if tp is object:  # as given, command-line values kept: checked later against a type only known then
        return value    # (a task's options: `agentrl.config.task_options`)
    if tp is Any:
        return plain(value)
    if tp is type(None):  # the `None` arm of `str | None`: YAML's null
        _check(value is None, path, f"expected null, got {value!r}")
        return None
    if origin is dict:
        _check(isinstance(value, dict), path, f"expected a mapping, got {value!r}")
        key_tp, value_tp = typing.get_args(tp)
        return {_coerce(k, key_tp, path): _coerce(v, value_tp, f"{path}.{k}") for k, v in value.items()}
    if origin is tuple:
        _check(isinstance(value, (list, tuple)), path, f"expected a list, got {value!r}")
        (item,) = {a for a in typing.get_args(tp) if a is not Ellipsis}
        return tuple(_coerce(v, item, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is Literal:  # a choice: one of the listed values, as YAML or the command line gave it
        choices = typing.get_args(tp)
        if isinstance(value, Scalar):
            value = str(value) if str(value) in choices else value.parsed
        _check(value in choices and type(value) in {type(c) for c in choices}, path,
               f"unknown value {value!r} ({' | '.join(str(c) for c in choices)})")
        return value
    if isinstance(tp, types.UnionType) or origin is typing.Union:  # `float | Literal["auto"]`: the first arm that fits
        wanted = []
        for arm in typing.get_args(tp):
            try:
                return _coerce(value, arm, path)
            except ConfigError:
                wanted.append(" | ".join(map(str, typing.get_args(arm))) if typing.get_origin(arm) is Literal
                              else "a number" if arm is float else getattr(arm, "__name__", str(arm)))
        got = str(value) if isinstance(value, Scalar) else repr(value)
        raise ConfigError(f"{path}: expected {' or '.join(wanted)}, got {got}")
    if isinstance(value, Scalar):  # a command-line value: the text for strings, the number for numbers
        value = str(value) if tp is str else value.parsed
    if tp is bool:
        _check(isinstance(value, bool), path, f"expected true/false, got {value!r}")
        return value
    if tp is int:
        _check(isinstance(value, int) and not isinstance(value, bool), path, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str) and _looks_numeric(value) and value.strip() == value:
            value = float(value)  # YAML 1.1 reads 1e-5 (no dot) as a string
        _check(isinstance(value, (int, float)) and not isinstance(value, bool), path,
               f"expected a number, got {value!r}")
        return float(value)
    if tp is str:
        _check(isinstance(value, str), path, f"expected a string, got {value!r}")
        return str(value)
    raise ConfigError(f"{path}: unsupported type {tp}")


MOVED = {"cluster.rollout.lagging_prob": "rollout.lagging_prob", "cluster.rollout.linger_ms": "rollout.linger_ms",
         "rollout.kv_cache_gib": "cluster.rollout.kv_cache_gib",
         "cluster.rollout.kv_cache_memory_gib": "cluster.rollout.kv_cache_gib"}
"""Fields that moved, old place → new: a config that still sets the old one fails at load naming both (sampling
settings live in `rollout`; the topology and the engines' memory in `cluster`, with one KV-cache size)."""

WARM_START_KEYS = ("steps", "lr", "batch", "warmup_steps", "all_tokens", "successful_only", "target", "min_token_prob",
                   "check_every", "holdout")
RENAMED = {"rollout.samples_per_prompt": "rollout.group_size", "rollout.prompts_per_step": "rollout.groups_per_task",
           **{f"trainer.sft_{k}": f"trainer.warm_start_{k}" for k in WARM_START_KEYS}}
"""Keys renamed, old name → new (one name per thing: docs/architecture.md §11). An old key, in a preset, a run
dir's config.yaml written before the rename, or on the command line, is read as the new one with a warning; the
old and the new key set together (in one file, or both on the command line) fail at load naming both."""
RENAMED_VALUES = {"trainer.update": {"sft": "warm_start"}}
"""Values renamed, per key: old value → new, read the same way (the control run was `trainer.update=sft`)."""


def _find(tree: dict[str, Any], dotted: str) -> tuple[dict[str, Any], str] | None:
    """Where `tree` sets `dotted`: (the mapping, its key there), as a dotted key of its own (the command line's
    overrides) or one level down (a YAML tree); None if it does not."""
    if dotted in tree:
        return tree, dotted
    section, _, key = dotted.rpartition(".")
    node = tree.get(section)
    return (node, key) if isinstance(node, dict) and key in node else None


def new_names(data: dict[str, Any], source: str) -> dict[str, Any]:
    """`data` (a YAML tree, or dotted keys from the command line) with its renamed keys and values (`RENAMED`,
    `RENAMED_VALUES`) under their new names, and one warning line that names each; `source` says where `data`
    comes from. Raises ConfigError naming both when `data` sets a key under its old and its new name."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    read = []
    for old, new in RENAMED.items():
        found = _find(out, old)
        if found is None:
            continue
        _check(_find(out, new) is None, f"{old}, {new}",
               f"{source} sets both; {old} is the old name of {new}: keep {new} only")
        node, key = found
        new_key = new if key == old else new.rpartition(".")[2]  # the whole dotted key, or the field in its section
        node[new_key] = node.pop(key)
        read.append(f"{old} as {new}")
    for dotted, values in RENAMED_VALUES.items():
        found = _find(out, dotted)
        if found is not None and isinstance(found[0][found[1]], str) and found[0][found[1]] in values:
            node, key = found
            read.append(f"{dotted}={node[key]} as {dotted}={values[node[key]]}")
            node[key] = values[node[key]]
    if read:
        log.warning("%s: old names read under their new ones: %s", source, "; ".join(read))
    return out


def _build(cls: type, data: dict[str, Any], path: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        where = f"{path}.{key}" if path else key
        _check(where not in MOVED, where, f"moved to {MOVED.get(where)}: set that instead")
        _check(key in names, where, f"unknown field (known: {', '.join(sorted(names))})")
    kwargs = {k: _coerce(v, hints[k], f"{path}.{k}" if path else k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ValueError as e:  # a dataclass that checks itself (a task's options): "field: why", named from here
        raise ConfigError(f"{path}.{e}" if path else str(e)) from e
