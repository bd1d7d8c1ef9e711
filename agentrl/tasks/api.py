"""The task author's API: what a task is, what its episodes receive and answer, and the one error type.

A task is one class that names its tools, lists its sample indices per split and starts episodes; an
episode answers the model's validated tool calls with tool messages until it ends with a reward and a
status (docs/tasks.md is the guide, `agentrl/tasks/example.py` a complete task). Nothing needs to
inherit from anything: `Task` and `Episode` are protocols. An episode may add `AnswersInText` (a
plain-text reply is an action, e.g. a final answer), `HasOwnTools` (each sample brings its own subset of
the task's tools) and `Closable` (it holds a sandbox or a database, freed when the session ends).

Everything else is done for the task: `agentrl.serving.session.Session` checks each call against its tool's
JSON Schema, answers malformed calls, counts turns and turns a raising task into an `env_error` ending;
`agentrl.serving.wire_types` carries the results over HTTP. A task whose tools do slow work reads what is
left of the agent's budget for the current message with `time_left()` and raises `BudgetExceeded` when
the message asked for more.

This module imports only the standard library and `agentrl.types`.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agentrl.types import Status

__all__ = ["ERROR_HTTP_STATUS", "Action", "AnswersInText", "BudgetExceeded", "Closable", "EnvError", "Episode",
           "HasOwnTools", "Status", "StepResult", "Task", "ToolCall", "message_budget", "message_deadline",
           "time_left", "tool_message"]

ERROR_HTTP_STATUS: dict[str, int] = {
    "bad_request": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "busy": 409,
    "unknown_session": 404,
    "unknown_task": 404,
    "not_found": 404,
    "internal": 500,
    "env_error": 502,
    "no_capacity": 503,
}


class EnvError(Exception):
    """An error of the env API, carried on the wire as `{"error": {"code", "message"}}`.

    `code` is one of `ERROR_HTTP_STATUS`'s keys; the HTTP status follows from it. A task raises
    `EnvError("bad_request", ...)` for an unknown split or index.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return ERROR_HTTP_STATUS.get(self.code, 500)

    def to_wire(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message}}

    @classmethod
    def from_wire(cls, body: Any, http_status: int) -> EnvError:
        """Rebuild the error from a response body; a body that is not ours becomes env_error."""
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict) and isinstance(err.get("code"), str):
            return cls(err["code"], str(err.get("message", "")))
        return cls("env_error", f"HTTP {http_status}: {str(body)[:200]}")


# ------------------------------------------------------------------------------------- the agent's budget

class BudgetExceeded(Exception):
    """Raised by task code when the agent's message asked for more than its budget allows (time, memory,
    size): `Session` ends the episode as the agent's failure, never as env_error."""


_message = threading.local()


def message_deadline() -> float:
    """The `time.monotonic()` by which the message being handled on this thread must be answered (inf
    outside a message). Tasks give each unit of work what is left of it (`time_left`)."""
    return float(getattr(_message, "deadline", float("inf")))


def time_left() -> float:
    """Seconds left of the current message's budget (inf outside a message)."""
    return message_deadline() - time.monotonic()


@contextlib.contextmanager
def message_budget(seconds: float) -> Iterator[None]:
    """The budget of one message on this thread: `message_deadline()` is now + `seconds` inside. `Session`
    sets it around each step; a task only reads it."""
    before = getattr(_message, "deadline", None)
    _message.deadline = time.monotonic() + seconds
    try:
        yield
    finally:
        _message.deadline = before if before is not None else float("inf")


# ------------------------------------------------------------------------------------------ task API

@dataclass
class StepResult:
    """What an episode answers to one action. `status` is RUNNING until `done`."""

    messages: list[dict[str, Any]]
    done: bool = False
    reward: float = 0.0
    status: Status = Status.RUNNING
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class ToolCall:
    """One tool call whose arguments parsed as JSON and passed the tool's schema.

    Under a lenient `CallPolicy` (`agentrl.tasks.protocol`) nothing is checked: `arguments` is whatever
    JSON was sent (None when it did not parse, and `error` then says why) and `name` may be unknown.
    """

    id: str
    name: str
    arguments: Any
    error: str | None = None


@dataclass
class Action:
    """The validated assistant message an episode receives: its text and its valid tool calls.

    `tool_calls` is never empty: a message without a valid call is answered by `Session` and never
    reaches `step` (a message with no call at all goes to `text_step` on an `AnswersInText` episode).
    `message` is the raw assistant message as the model sent it.
    """

    content: str
    tool_calls: list[ToolCall]
    message: dict[str, Any]


@runtime_checkable
class Episode(Protocol):
    """One running sample. Methods may raise: `Session` turns that into an env_error ending."""

    def initial_messages(self) -> list[dict[str, Any]]:
        """System and user messages the conversation starts with."""
        ...

    def step(self, action: Action) -> StepResult:
        """Answer validated tool calls with messages (usually one `role: tool` message per call)."""
        ...

    def expert_message(self) -> dict[str, Any]:
        """The assistant message the task's scripted expert would send now."""
        ...


@runtime_checkable
class AnswersInText(Protocol):
    """Optional for an episode whose agent may end a step in plain text (no tool call).

    AgentBench-FC's `kg` ends with an assistant message "Final Answer: #3" and BFCL's multi-turn cases
    end each user turn with a message that calls no tool. `Session` hands such a message to
    `text_step`; returning None falls back to the shared "please call a tool" observation.
    """

    def text_step(self, content: str) -> StepResult | None:
        ...


@runtime_checkable
class HasOwnTools(Protocol):
    """Optional for an episode whose sample brings its own tools (BFCL: the classes a case involves).

    `tools()` must be a subset of the task's `tools()` (the worker validates against the task's), and
    `Session.toolbox` then validates this sample's calls against the episode's own list.
    """

    def tools(self) -> list[dict[str, Any]]:
        ...


@runtime_checkable
class Closable(Protocol):
    """Optional for an episode that holds resources (a sandbox, a database connection).

    `Session.close()` calls `close()` once: when the episode ends, and when the worker cancels or drops
    the session. It must be idempotent and should not raise.
    """

    def close(self) -> None:
        ...


@runtime_checkable
class Task(Protocol):
    """A task: tool schemas, sample indices per split, and episodes. One instance serves all sessions.

    `indices` and `start` raise `EnvError("bad_request", ...)` for an unknown split or index.

    Options: the task's constructor options (`envs.task_options.<task>` in the run config) are declared by a
    class attribute `Options`, a frozen dataclass whose fields are the constructor's keyword arguments (types
    and defaults); the config loader checks them at load, naming the field (`agentrl.config.task_options`), and
    the worker builds the task with them. Its `__post_init__` raises `OptionError(field, why)` for a value
    no type can rule out (a range, a checkout that must exist); `per_call_limits()` names the options that
    bound one unit of work in seconds (each must fit the agent's per-message budget). A task without options
    leaves `Options` out (`NoOptions`).

    Optional attributes: `isolation = "thread"` runs the task's sessions in the worker's own process
    instead of a process per session (`agentrl.serving.isolation`); `blocking = True` says its methods are
    slow or block (subprocesses, a database), so in-process tools that play many episodes (the expert
    report) run them in threads. The worker runs every task call off its event loop either way.
    """

    name: str
    max_turns: int

    def tools(self) -> list[dict[str, Any]]:
        ...

    def indices(self, split: str) -> list[str]:
        ...

    def start(self, index: str) -> Episode:
        ...


@dataclass(frozen=True)
class NoOptions:
    """The options of a task that takes none."""

    def per_call_limits(self) -> dict[str, float]:
        return {}


class OptionError(ValueError):
    """A task option that fails its own check: `str(e)` is "field: why" (the loader puts the task's path before
    it: `envs.task_options.os.sandbox.command_timeout_s: must be > 0`)."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field}: {why}")
        self.field = field


def tool_message(call_id: str, name: str, content: str) -> dict[str, Any]:
    """The tool message that answers the call `call_id` of tool `name`."""
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}
