"""Each task's options, checked at load against the frozen dataclass the task declares (`Task.Options`), and the
time limits that apply to one message of a task.

`envs.task_options.os.sandbox.command_timeout_s=abc` fails here, at load, as
`envs.task_options.os.sandbox.command_timeout_s: expected a number, got 'abc'`, like every other setting; so does a
value the options' own check rules out (a db task reading AgentBench's data without a checkout). What the config
keeps is the mapping as given, its values read as their fields' types: the worker builds each task with it
(`get_task(spec, **options)`), and the config writes back and reads again as itself.

The per-message budget is set in one place, `envs.message_budget_s`, bounded by the worker's deadline for a call
(`worker_call_timeout_s`, from `controller.request_timeout_s`); a task's own per-call limits (`per_call_limits()`
of its options: the os task's `sandbox.command_timeout_s`, the db task's `statement_timeout_s`) must fit in it.
`python -m jobs.check_task` prints all three.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from agentrl.config.errors import ConfigError, _check
from agentrl.config.sections import ControllerConfig, EnvsConfig
from agentrl.config.typed import _coerce, plain
from agentrl.tasks import options_type, task_name


def worker_call_timeout_s(controller: ControllerConfig) -> float:
    """How long an env worker lets one task call run: below the controller's request timeout, so that the worker
    answers (the session ends as env_error) before the controller gives the worker up."""
    return max(0.8 * controller.request_timeout_s, controller.request_timeout_s - 5.0)


def capped_budget_s(message_budget_s: float, call_timeout_s: float) -> float:
    """The agent's budget for one message as a worker applies it: at most 3/4 of the worker's deadline for a call,
    so that a message cut at its budget is still answered in time (`agentrl.serving.worker.EnvWorker`)."""
    return min(message_budget_s, 0.75 * call_timeout_s)


def message_budget_s(envs: EnvsConfig, controller: ControllerConfig) -> float:
    """The agent's budget for one message in a run: `envs.message_budget_s`, capped by `capped_budget_s`."""
    return capped_budget_s(envs.message_budget_s, worker_call_timeout_s(controller))


def _as_given(raw: dict[str, Any], typed: Any) -> dict[str, Any]:
    """The keys of `raw`, each with its value as the options dataclass `typed` read it."""
    out = {}
    for key, value in raw.items():
        read = getattr(typed, key)
        out[key] = _as_given(value, read) if isinstance(value, dict) and dataclasses.is_dataclass(read) else read
    return out


def task_options_of(spec: str, raw: dict[str, Any], path: str) -> Any:
    """The options dataclass of the task of `spec` built from `raw` (ConfigError naming the field if it does not
    fit); None for a task that declares no `Options`."""
    try:
        cls = options_type(spec)
    except (ImportError, AttributeError, KeyError, ValueError) as e:
        raise ConfigError(f"{path}: cannot find the task {spec!r} ({type(e).__name__}: {e})") from e
    if cls is None:
        return None
    _check(isinstance(raw, dict), path, "must be a mapping of option: value")
    _check(not raw or bool(dataclasses.fields(cls)), path, f"the task {spec!r} takes no options")
    return _coerce(raw, cls, path)


def checked_task_options(envs: EnvsConfig, controller: ControllerConfig, p: str = "envs") -> dict[str, dict[str, Any]]:
    """`envs.task_options` checked against each task's `Options` (and each task of `envs.tasks` with none given:
    its defaults must hold too), each per-call limit within the message budget; returns the options as given,
    their values read as their fields' types. Raises ConfigError naming the field."""
    budget = message_budget_s(envs, controller)
    out: dict[str, dict[str, Any]] = {}
    for spec in envs.tasks:
        raw = envs.task_options.get(spec, {})
        path = f"{p}.task_options.{spec}" if spec in envs.task_options else f"{p}.tasks"
        typed = task_options_of(spec, raw, path)
        if typed is None:
            if raw:
                out[spec] = plain(raw)
            continue
        for field, seconds in typed.per_call_limits().items():
            _check(seconds <= budget, f"{p}.task_options.{spec}.{field}",
                   f"{seconds:g} s does not fit the agent's budget for one message, {budget:g} s (envs.message_budget_s"
                   f"={envs.message_budget_s:g}, at most 3/4 of the worker's deadline for a call, "
                   f"{worker_call_timeout_s(controller):g} s from controller.request_timeout_s="
                   f"{controller.request_timeout_s:g}): lower it, or raise those")
        if raw:
            out[spec] = _as_given(raw, typed)
    return out


def task_names(envs: EnvsConfig) -> tuple[str, ...]:
    """The names the workers serve `envs.tasks` under (`"agentrl.tasks.example:GuessTask"` → "guess"), as the
    controller and every metric know them; a built-in task's without importing it."""
    return tuple(task_name(spec) for spec in envs.tasks)


def describe_budget(options: Any, envs: EnvsConfig, controller: ControllerConfig) -> str:
    """One line on the time one message of a task gets and what bounds it (what `jobs.check_task` prints):
    `per message 18 s (envs.message_budget_s 18 s; the worker's deadline for a call, 25 s from
    controller.request_timeout_s 30 s, caps it at 18.75 s); within it sandbox.command_timeout_s 10 s`."""
    call_s = worker_call_timeout_s(controller)
    text = (f"per message {message_budget_s(envs, controller):g} s (envs.message_budget_s "
            f"{envs.message_budget_s:g} s; the worker's deadline for a call, {call_s:g} s from "
            f"controller.request_timeout_s {controller.request_timeout_s:g} s, caps it at {0.75 * call_s:g} s)")
    limits = options.per_call_limits() if options is not None and hasattr(options, "per_call_limits") else {}
    if limits:
        text += "; within it " + ", ".join(f"{field} {seconds:g} s" for field, seconds in limits.items())
    return text
