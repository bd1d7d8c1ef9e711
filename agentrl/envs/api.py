"""The Task API and the wire types of the env gateway (docs/architecture.md §4).

What is here:
  * `Task` / `Episode`: the two protocols a task author implements (tools, indices, an episode that
    answers validated tool calls with messages until it ends with a reward and a status), and two
    optional ones an episode may add: `AnswersInText` (a plain-text reply is an action, e.g. a final
    answer) and `HasOwnTools` (each sample brings its own subset of the task's tools), and `Closable`
    (an episode that holds a sandbox or a database frees it when the session ends);
  * `ToolBox` and `Session`: the layer every task shares. It parses each tool call's JSON arguments,
    checks them against the tool's JSON Schema, turns every kind of malformed action into an
    observation the model can learn from, counts turns, enforces `max_turns`, and turns a raising task
    into an `env_error` ending instead of a crashed worker;
  * `StartResult`, `InteractResult`, `EnvError`: what travels over HTTP between rollout, controller
    and workers (JSON; `to_wire`/`from_wire` convert).

What is not here: HTTP (see `client.py` and `worker.py`), routing (`agentrl.controller`), any task
(`agentrl.envs.tasks`). This module imports only the standard library, jsonschema, `agentrl.types`
and `agentrl.envs.protocol` (the call policies of the faithful protocol).
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import jsonschema

from agentrl.envs.json_args import ArgumentsError, loads_arguments
from agentrl.envs.protocol import STRICT, CallPolicy, parse_lenient, policy_of, select_calls
from agentrl.types import Status

log = logging.getLogger(__name__)

MAX_ARGUMENT_BYTES = 8 * 1024
"""Tool-call arguments longer than this are refused before parsing (a runaway generation, not a call)."""
MAX_OUTPUT_CHARS = 16 * 1024
"""Env message contents longer than this are cut with a marker (a tool that printed a whole file)."""
MAX_TOOL_CALLS = 16
"""Tool calls in one assistant message beyond this are refused as a whole (none is run): a runaway
generation of 38,000 calls must cost one cheap error observation, not seconds of validation."""
SHOWN_CHARS = 200
"""An error message quotes at most this much of the caller's input (`shown`)."""
MESSAGE_BUDGET_S = 18.0
"""Wall time for the work one assistant message asks for: all its calls and the grading of an answer it
gives. It is the agent's budget: work that stops at it (a statement cut short, a command stopped) is an
observation, and a message whose work cannot be stopped in time ends the episode as the agent's failure
(docs/tasks.md, "Whose failure is it"). The worker's own deadline for a call lies beyond it."""

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

    `code` is one of `ERROR_HTTP_STATUS`'s keys; the HTTP status follows from it.
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


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """`repr(value)` for an error message, cut to `limit` characters: errors never echo a huge input back."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


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
    """The budget of one message on this thread: `message_deadline()` is now + `seconds` inside."""
    before = getattr(_message, "deadline", None)
    _message.deadline = time.monotonic() + seconds
    try:
        yield
    finally:
        _message.deadline = before if before is not None else float("inf")


AGENT_FAULTS: tuple[type[BaseException], ...] = (BudgetExceeded, MemoryError, RecursionError, OverflowError)
"""Exceptions that say the agent's input asked for more than the environment's bounds: memory, depth, the
size of a number, the message's budget. Out of a step they end the episode as the agent's failure."""


def agent_fault(e: BaseException) -> bool:
    """Whether an exception raised while handling the agent's message means the message exceeded one of the
    environment's budgets (`AGENT_FAULTS`, or Python's bound on converting a huge integer to or from text,
    e.g. `Final Answer: #<4,301 digits>`), rather than that the task is broken (env_error)."""
    if isinstance(e, AGENT_FAULTS):
        return True
    return isinstance(e, ValueError) and "integer string conversion" in str(e)


def cut(text: str, limit: int = SHOWN_CHARS) -> str:
    """`text` cut to `limit` characters, saying how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


# ------------------------------------------------------------------------------------------ wire types

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
class StepResult:
    """What an episode answers to one action. `status` is RUNNING until `done`."""

    messages: list[dict[str, Any]]
    done: bool = False
    reward: float = 0.0
    status: Status = Status.RUNNING
    metrics: dict[str, float] = field(default_factory=dict)


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


# ------------------------------------------------------------------------------------------ task API

@dataclass
class ToolCall:
    """One tool call whose arguments parsed as JSON and passed the tool's schema.

    Under a lenient `CallPolicy` (`agentrl.envs.protocol`) nothing is checked: `arguments` is whatever
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
    Set `blocking = True` on a task whose methods are slow; the worker then runs them in a thread.
    """

    name: str
    max_turns: int

    def tools(self) -> list[dict[str, Any]]:
        ...

    def indices(self, split: str) -> list[str]:
        ...

    def start(self, index: str) -> Episode:
        ...


def tool_message(call_id: str, name: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


_COMPILED: dict[str, Any] = {}
"""Compiled validators by the schema's JSON: checking a schema against its metaschema costs milliseconds, and
a task whose samples bring their own tools (`HasOwnTools`) builds a ToolBox per session. The key keeps the
schema's own key order: which of two errors a call gets (`best_match` ties) follows it, so two tasks with
equal schemas in different orders must not share one validator (one task's messages would then depend on
whether the other ran first in the worker)."""


def _compiled(schema: dict[str, Any]) -> Any:
    key = json.dumps(schema)
    validator = _COMPILED.get(key)
    if validator is None:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)  # a broken schema is the task author's bug: fail at worker start
        validator = cls(schema)
        if len(_COMPILED) < 10_000:
            _COMPILED[key] = validator
    return validator


class ToolBox:
    """The tool schemas of one task, compiled once, and the checks every tool call goes through."""

    def __init__(self, tools: list[dict[str, Any]], max_argument_bytes: int = MAX_ARGUMENT_BYTES,
                 max_tool_calls: int = MAX_TOOL_CALLS) -> None:
        self.tools = tools
        self.max_argument_bytes = max_argument_bytes
        self.max_tool_calls = max_tool_calls
        self.validators: dict[str, Any] = {}
        for tool in tools:
            fn = tool["function"]
            self.validators[fn["name"]] = _compiled(fn.get("parameters") or {"type": "object"})
        self.names = ", ".join(self.validators)

    def check(self, message: dict[str, Any],
              policy: CallPolicy = STRICT) -> tuple[list[ToolCall], list[dict[str, Any]]]:
        """Split an assistant message's tool calls into valid calls and error observations.

        Each invalid call gets a tool message starting with "Error:" that says what was wrong, so the
        model can learn from it; a message with no tool call at all gets a user message asking for one.
        `policy` may keep only the first call and pass every call unchecked (`agentrl.envs.protocol`).
        """
        raw_calls = message.get("tool_calls") or []
        if not isinstance(raw_calls, list):
            raise EnvError("bad_request", "tool_calls must be a list")
        if not raw_calls:
            return [], [{"role": "user", "content": f"Please call one of the tools: {self.names}."}]
        raw_calls = select_calls(raw_calls, policy)  # AgentBench's protocol keeps only the first
        if len(raw_calls) > self.max_tool_calls:
            return [], [{"role": "user", "content": f"Error: {len(raw_calls)} tool calls in one message; the limit "
                                                    f"is {self.max_tool_calls}. None of them was run."}]
        if policy.lenient_arguments:
            return [ToolCall(*parse_lenient(raw, i, self.max_argument_bytes)) for i, raw in enumerate(raw_calls)], []
        calls: list[ToolCall] = []
        errors: list[dict[str, Any]] = []
        for i, raw in enumerate(raw_calls):
            call_id = str(raw.get("id") or f"call_{i}") if isinstance(raw, dict) else f"call_{i}"
            fn = raw.get("function") if isinstance(raw, dict) else None
            name = fn.get("name") if isinstance(fn, dict) else None
            if not isinstance(fn, dict) or not isinstance(name, str) or not name:
                errors.append(tool_message(call_id, "", "Error: the tool call has no function name."))
                continue
            problem, args = self._check_call(name, fn.get("arguments"))
            if problem is not None:
                errors.append(tool_message(call_id, name, f"Error: {problem}"))
            else:
                calls.append(ToolCall(id=call_id, name=name, arguments=args))
        return calls, errors

    def _check_call(self, name: str, arguments: Any) -> tuple[str | None, dict[str, Any]]:
        if name not in self.validators:
            return f"unknown tool {shown(name)}; the tools are: {self.names}.", {}
        if arguments is None or arguments == "":
            arguments = "{}"
        if isinstance(arguments, dict):  # tolerated: some clients send parsed arguments
            try:
                arguments = json.dumps(arguments)
            except (ValueError, RecursionError):  # nested past the recursion limit
                return "arguments are nested too deeply.", {}
        if not isinstance(arguments, str):
            return "arguments must be a JSON object.", {}
        size = len(arguments.encode(errors="surrogatepass"))
        if size > self.max_argument_bytes:
            return f"arguments are too long ({size} bytes, limit {self.max_argument_bytes}).", {}
        try:  # no input raises anything but the call's own error (huge integers, NaN, lone surrogates, depth)
            args = loads_arguments(arguments)
        except ArgumentsError as e:
            return f"arguments are {e}.", {}
        if not isinstance(args, dict):
            return "arguments must be a JSON object.", {}
        err = jsonschema.exceptions.best_match(self.validators[name].iter_errors(args))
        if err is not None:
            where = "/".join(str(p) for p in err.absolute_path)
            return f"invalid arguments for {name}{' at ' + where if where else ''}: {err.message}.", {}
        return None, args


def truncate_messages(messages: list[dict[str, Any]], max_chars: int) -> list[dict[str, Any]]:
    """Cut each message whose text content exceeds `max_chars`, saying how much was cut."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str) and len(content) > max_chars:
            m = {**m, "content": f"{content[:max_chars]}\n[... {len(content) - max_chars} more characters cut]"}
        out.append(m)
    return out


class Session:
    """One episode behind the shared checks: validation, turn counting, the turn limit, task failures.

    Every assistant message counts as a turn, valid or not. When the turn limit is reached without an
    ending, the episode ends as `turn_limit` with reward 0.0 (penalties are the trainer's business).
    Metrics are the latest the episode reported, so a task can report e.g. success=0.0 early.

    Each message's work runs under `message_budget_s` (`message_budget`: task code reads what is left with
    `time_left()`). An exception out of the episode is the agent's failure when it says the message
    exceeded a budget (`agent_fault`: status invalid_action, an observation saying so, metric
    `over_budget`), else the task's (env_error).
    """

    def __init__(self, task: Task, index: str, toolbox: ToolBox | None = None,
                 max_output_chars: int = MAX_OUTPUT_CHARS, message_budget_s: float = MESSAGE_BUDGET_S) -> None:
        self.max_output_chars = max_output_chars
        self.message_budget_s = message_budget_s
        self.task = task
        self.index = index
        self.toolbox = toolbox or ToolBox(task.tools())
        self.turns = 0
        self.done = False
        self.metrics: dict[str, float] = {}
        try:
            self.episode = task.start(index)
            self.messages = list(self.episode.initial_messages())
            if isinstance(self.episode, HasOwnTools):
                self.toolbox = ToolBox(self.episode.tools(), self.toolbox.max_argument_bytes,
                                       self.toolbox.max_tool_calls)
        except EnvError:
            self.close()
            raise
        except Exception as e:
            self.close()
            log.exception("task %s failed to start sample %s", task.name, shown(index))
            raise EnvError("env_error", f"task {task.name} failed to start {shown(index)}: "
                                        f"{type(e).__name__}: {str(e)[:SHOWN_CHARS]}") from e

    def interact(self, message: Any) -> InteractResult:
        if self.done:
            raise EnvError("bad_request", "the episode has already ended")
        if not isinstance(message, dict) or message.get("role", "assistant") != "assistant":
            raise EnvError("bad_request", "message must be an assistant message object")
        calls, errors = self.toolbox.check(message, policy_of(self.episode, self.task))
        self.turns += 1
        result = StepResult(messages=errors)
        if not message.get("tool_calls") and isinstance(self.episode, AnswersInText):
            try:
                with message_budget(self.message_budget_s):
                    step = self.episode.text_step(str(message.get("content") or ""))
            except Exception as e:
                return self._failed(e)
            if step is not None:
                result = step
        elif calls:
            action = Action(content=str(message.get("content") or ""), tool_calls=calls, message=message)
            try:
                with message_budget(self.message_budget_s):
                    step = self.episode.step(action)
            except Exception as e:
                return self._failed(e, errors)
            result = StepResult(messages=errors + list(step.messages), done=step.done, reward=step.reward,
                                status=Status(step.status), metrics=step.metrics)
        if result.metrics:
            self.metrics = dict(result.metrics)
        if result.done:
            if result.status == Status.RUNNING:  # a task that forgot to say how it ended
                result.status = Status.COMPLETED
        elif self.turns >= self.task.max_turns:
            result.done, result.reward, result.status = True, 0.0, Status.TURN_LIMIT
        self.done = result.done
        if self.done:
            self.close()
        out = InteractResult.from_step(result)
        out.metrics = dict(self.metrics)
        out.messages = truncate_messages(out.messages, self.max_output_chars)
        return out

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tools of this session: the episode's own (`HasOwnTools`) or the task's."""
        return self.toolbox.tools

    def _failed(self, e: Exception, errors: list[dict[str, Any]] | None = None) -> InteractResult:
        """The episode's end when its step raised: the agent's failure when its message exceeded a budget
        (`agent_fault`), else env_error (a broken task)."""
        self.done = True
        self.close()
        if agent_fault(e):
            log.info("task %s: the agent's message exceeded a budget (index %s): %s", self.task.name, self.index,
                     shown(f"{type(e).__name__}: {e}"))
            return over_budget(f"{type(e).__name__}: {cut(str(e))}", errors, self.metrics)
        log.exception("task %s raised in step (index %s)", self.task.name, self.index, exc_info=e)
        text = f"Error: the environment failed ({type(e).__name__}: {cut(str(e))})."
        return InteractResult(messages=(errors or []) + [{"role": "user", "content": text}], done=True,
                              status=Status.ENV_ERROR, metrics=self.metrics, error=text)

    def close(self) -> None:
        """Free the episode's resources (see `Closable`); idempotent, never raises."""
        episode = getattr(self, "episode", None)
        if episode is None or getattr(self, "_closed", False):
            return
        self._closed = True
        if isinstance(episode, Closable):
            try:
                episode.close()
            except Exception:
                log.exception("task %s failed to close (index %s)", self.task.name, self.index)

    def expert_message(self) -> dict[str, Any]:
        try:
            return self.episode.expert_message()
        except Exception as e:
            log.exception("task %s expert failed (index %s)", self.task.name, self.index)
            raise EnvError("env_error", f"expert of {self.task.name} failed: {type(e).__name__}: {e}") from e


def over_budget(why: str, errors: list[dict[str, Any]] | None = None,
                metrics: dict[str, float] | None = None) -> InteractResult:
    """The end of an episode whose message asked for more than the environment's budgets: the agent's
    failure (invalid_action, reward 0, metric `over_budget`), with an observation that says `why`."""
    text = f"Error: your last message asked for more than this environment allows ({why}); the episode ends."
    return InteractResult(messages=(errors or []) + [{"role": "user", "content": text}], done=True, reward=0.0,
                          status=Status.INVALID_ACTION, metrics={**(metrics or {}), "over_budget": 1.0})
