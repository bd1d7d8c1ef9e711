"""The layer every task shares: one episode behind the checks of its calls, its turn limit and its failures.

  * `ToolBox`: a task's tool schemas, compiled once, and the checks every tool call goes through (JSON
    arguments, at most `MAX_ARGUMENT_BYTES`, valid against the tool's JSON Schema; at most
    `MAX_TOOL_CALLS` in one message). Every kind of malformed action becomes an observation the model can
    learn from;
  * `Session`: one episode of a `Task` (`agentrl.tasks.api`). It counts turns, enforces `max_turns`, runs
    each message's work under the agent's budget (`MESSAGE_BUDGET_S`), cuts long observations
    (`MAX_OUTPUT_CHARS`), and turns a raising task into an `env_error` ending instead of a crashed worker
    (or into the agent's failure when the message asked for more than a budget allows: `agent_fault`).

The env worker runs a `Session` per session (in a process of its own: `agentrl.serving.isolation`), as do the
in-process client (`agentrl.serving.inprocess`) and the checks (`agentrl.checks`). Not here: HTTP
(`agentrl.serving.client`, `agentrl.serving.worker`), routing (`agentrl.serving.controller`), any task
(`agentrl.tasks`). This module imports only the standard library, jsonschema, `agentrl.types` and
the env modules below it: the task API, the wire types, `protocol` (the call policies of the faithful
protocol) and `json_args`.
"""
from __future__ import annotations

import json
import logging
from typing import Any

import jsonschema

from agentrl.config import EnvsConfig
from agentrl.serving.wire_types import SHOWN_CHARS, InteractResult, cut, shown
from agentrl.tasks.api import (
    Action,
    AnswersInText,
    BudgetExceeded,
    Closable,
    EnvError,
    HasOwnTools,
    StepResult,
    Task,
    ToolCall,
    message_budget,
    tool_message,
)
from agentrl.tasks.json_args import ArgumentsError, loads_arguments
from agentrl.tasks.protocol import STRICT, CallPolicy, parse_lenient, policy_of, select_calls
from agentrl.types import Status

log = logging.getLogger(__name__)

MAX_ARGUMENT_BYTES = 8 * 1024
"""Tool-call arguments longer than this are refused before parsing (a runaway generation, not a call)."""
MAX_OUTPUT_CHARS = 16 * 1024
"""Env message contents longer than this are cut with a marker (a tool that printed a whole file)."""
MAX_TOOL_CALLS = 16
"""Tool calls in one assistant message beyond this are refused as a whole (none is run): a runaway
generation of 38,000 calls must cost one cheap error observation, not seconds of validation."""
MESSAGE_BUDGET_S = EnvsConfig.message_budget_s
"""`envs.message_budget_s`'s default, for sessions made outside a run (tests, in-process tools): wall time for
the work one assistant message asks for, all its calls and the grading of an answer it gives. It is the agent's
budget: work that stops at it (a statement cut short, a command stopped) is an observation, and a message whose
work cannot be stopped in time ends the episode as the agent's failure (docs/tasks.md, "Whose failure is it").
The worker's own deadline for a call lies beyond it."""

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
        `policy` may keep only the first call and pass every call unchecked (`agentrl.tasks.protocol`).
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
