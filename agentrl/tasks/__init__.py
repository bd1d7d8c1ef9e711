"""Tasks: the task author's API and the built-in tasks (what docs/tasks.md teaches), and the registry.

  * `api`: what a task is (Task, Episode, Action, StepResult, tool_message, EnvError, the agent's budget);
  * `protocol` (strict or AgentBench-faithful call policies) and `json_args` (bounded JSON arguments): the
    rules a task's calls are read by;
  * `options`: the built-in tasks' options, checked by the config loader at load;
  * the built-in tasks: `lookup`, `unlock`, `echo`, `example` (the guide's), `os_task/` (on the sandbox of
    `agentrl.sandbox`), `db/`, `kg/`, `webshop/`, `alfworld/`, `bfcl`, with `agentbench` and `shared`;
  * `task_data`: the generators of the built-in tasks' data files.

Nothing here imports the serving layer (`agentrl.serving`) or the checks: a task is written against `api`.
This module is the registry, task name → Task class. Built-in tasks are listed by import path and
imported only when asked for, so that a worker serving one task never imports another task's dependencies.
A user's task is a class plus one `register_task("mytask", MyTask)` call, or a `"package.module:Class"` name
in `envs.tasks`. Each task's options are a frozen dataclass (`options_type`), which the config loader checks
at load.
This module has no side effects on import.
"""
from __future__ import annotations

import importlib
from typing import Any

from agentrl.tasks.api import NoOptions, Task

_BUILTIN: dict[str, str] = {
    "lookup": "agentrl.tasks.lookup:LookupTask",
    "unlock": "agentrl.tasks.unlock:UnlockTask",
    "os": "agentrl.tasks.os_task:OsTask",
    "db": "agentrl.tasks.db:DbTask",
    "echo": "agentrl.tasks.echo:EchoTask",  # load tests of the controller (jobs/bench_controller.py)
    "kg": "agentrl.tasks.kg:KGTask",
    "webshop": "agentrl.tasks.webshop:WebShopTask",
    "alfworld": "agentrl.tasks.alfworld:AlfworldTask",
    "bfcl": "agentrl.tasks.bfcl:BfclTask",
}
_OPTIONS = "agentrl.tasks.options"
_BUILTIN_OPTIONS: dict[str, str] = {
    "lookup": f"{_OPTIONS}:SkillOptions", "unlock": f"{_OPTIONS}:SkillOptions", "os": f"{_OPTIONS}:OsOptions",
    "db": f"{_OPTIONS}:DbOptions", "kg": f"{_OPTIONS}:KgOptions", "webshop": f"{_OPTIONS}:WebShopOptions",
    "alfworld": f"{_OPTIONS}:AlfworldOptions", "bfcl": f"{_OPTIONS}:BfclOptions",
}
"""The built-in tasks' `Options`, by import path: a config is checked without importing the tasks themselves."""
_REGISTRY: dict[str, type] = {}


def register_task(name: str, cls: type) -> None:
    """Make `get_task(name)` build `cls()`. Re-registering a name replaces it (handy in tests)."""
    _REGISTRY[name] = cls


def task_names() -> list[str]:
    """Every name `get_task` knows without an import path."""
    return sorted(set(_BUILTIN) | set(_REGISTRY))


def _import(path: str) -> type:
    module, _, attr = path.partition(":")
    cls: type = getattr(importlib.import_module(module), attr)
    return cls


def get_task_class(name: str) -> type:
    """The class registered as `name`; `"pkg.mod:Class"` names are imported. KeyError if unknown."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name in _BUILTIN:
        return _import(_BUILTIN[name])
    if ":" in name:
        return _import(name)
    raise KeyError(f"unknown task {name!r} (known: {', '.join(task_names())})")


def task_name(spec: str) -> str:
    """The name a worker serves the task of `spec` under (its class's `name`): `"lookup"` → "lookup",
    `"agentrl.tasks.example:GuessTask"` → "guess". Everything that talks to the controller, and every
    report and metric, uses this name; `envs.tasks` and `envs.task_options` keep the spec as written.
    A built-in task's name is its registry name (tests/envs/test_task_options.py checks it), known without
    importing the task."""
    if spec in _BUILTIN and spec not in _REGISTRY:
        return spec
    cls = get_task_class(spec)
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"task {spec!r}: {cls.__name__} has no string `name` attribute")
    return name


def options_type(spec: str) -> type | None:
    """The frozen dataclass of the options the task of `spec` takes: its class's `Options` (a built-in task's is
    imported without the task, from `agentrl.tasks.options`; `NoOptions` for one that takes none); None for
    a user's task that declares none (its options are passed on unchecked). KeyError for an unknown name."""
    if spec in _BUILTIN and spec not in _REGISTRY:
        return _import(_BUILTIN_OPTIONS[spec]) if spec in _BUILTIN_OPTIONS else NoOptions
    options: type | None = getattr(get_task_class(spec), "Options", None)
    return options


def get_task(name: str, **options: Any) -> Task:
    """A new instance of the task registered as `name`, built with the task's own `options`
    (`envs.task_options[name]` in the run config, e.g. `agentbench_dir` or `backend`)."""
    cls = get_task_class(name)
    try:
        task: Task = cls(**options)
    except TypeError as e:
        if options and "argument" in str(e):  # an option the task does not take: say which task and why
            raise ValueError(f"task {name!r} does not accept the options {sorted(options)}: {e}") from e
        raise
    return task


def parse_task_options(items: list[str]) -> dict[str, object]:
    """A command line's `key=value` task options, values read as YAML scalars (`limit=3` is an int,
    `backend=sqlite` a string); a malformed item is a ValueError naming it."""
    import yaml

    out: dict[str, object] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--option {item!r}: expected key=value")
        out[key] = yaml.safe_load(raw) if raw else ""
    return out
