"""The JSON types of the session routes: what travels over HTTP between the rollout, the controller and the
env workers (docs/architecture.md §4). `to_wire` / `from_wire` convert.

  * `StartResult`: the answer to start_sample (session id, first messages, tools, the task's round limit);
  * `InteractResult`: the answer to interact (an episode's `StepResult` plus why the infrastructure ended
    it, if it did);
  * `EnvError` (defined with the task API, `agentrl.tasks.api`): every failure, as `{"error": {...}}`;
  * `require`, `shown`, `cut`: reading a request's fields, and quoting the caller's input in an error
    without echoing a huge one back.

Not here: HTTP itself (`agentrl.serving.wire` for the servers, `agentrl.serving.client` for the client). This
module imports only the standard library and the task API.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from agentrl.tasks.api import EnvError, StepResult
from agentrl.types import Status

__all__ = ["SHOWN_CHARS", "EnvError", "InteractResult", "StartResult", "cut", "require", "shown"]

SHOWN_CHARS = 200
"""An error message quotes at most this much of the caller's input (`shown`)."""


def cut(text: str, limit: int = SHOWN_CHARS) -> str:
    """`text` cut to `limit` characters, saying how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """`repr(value)` for an error message, cut to `limit` characters: errors never echo a huge input back."""
    return cut(repr(value), limit)


@dataclass
class StartResult:
    """Answer to start_sample: the new session, the conversation so far, the tool schemas and the task's
    own round limit (`max_turns`: assistant messages before the episode ends as turn_limit; None from a
    server that does not say)."""

    session_id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    max_turns: int | None = None

    def to_wire(self) -> dict[str, Any]:
        d: dict[str, Any] = {"session_id": self.session_id, "messages": self.messages, "tools": self.tools}
        if self.max_turns is not None:
            d["max_turns"] = self.max_turns
        return d

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> StartResult:
        turns = d.get("max_turns")
        return cls(session_id=str(d["session_id"]), messages=list(d["messages"]), tools=list(d["tools"]),
                   max_turns=int(turns) if turns is not None else None)


@dataclass
class InteractResult(StepResult):
    """StepResult on the wire. `error` explains an infrastructure ending (status env_error)."""

    error: str | None = None

    def to_wire(self) -> dict[str, Any]:
        d: dict[str, Any] = {"messages": self.messages, "done": self.done, "reward": float(self.reward),
                             "status": Status(self.status).value, "metrics": dict(self.metrics)}
        if self.error is not None:
            d["error"] = self.error
        return d

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> InteractResult:
        reward = float(d["reward"])
        if not math.isfinite(reward):  # NaN would be trained on as a number: the env failed
            raise ValueError(f"reward {reward} is not a finite number")
        return cls(messages=list(d["messages"]), done=bool(d["done"]), reward=reward,
                   status=Status(d["status"]), metrics=dict(d.get("metrics") or {}), error=d.get("error"))

    @classmethod
    def from_step(cls, r: StepResult) -> InteractResult:
        return cls(messages=r.messages, done=r.done, reward=r.reward, status=r.status, metrics=r.metrics)

    @classmethod
    def ended(cls, status: Status, error: str) -> InteractResult:
        """An episode ended by the infrastructure (dead worker, expiry): no observation, no reward."""
        return cls(messages=[], done=True, reward=0.0, status=status, error=error)


def require(body: Any, key: str, kind: type | tuple[type, ...] = str) -> Any:
    """`body[key]`, checked to be of `kind`; anything else is the caller's bad request."""
    if not isinstance(body, dict):
        raise EnvError("bad_request", "the request body must be a JSON object")
    value = body.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise EnvError("bad_request", f"field {key!r} is missing or not a {getattr(kind, '__name__', kind)}")
    return value
