"""The contract test for a task: call `check_task(MyTask())` from your own pytest.

    from agentrl.checks.contract import check_task

    def test_my_task_meets_the_contract():
        report = check_task(MyTask(), samples=20)
        assert report.solved["test"] >= 18   # your own bar, beyond the contract's

It checks, in this order, and raises `ContractError` naming the first broken rule:
  * the protocol: a non-empty `name`, an integer `max_turns >= 1`, the three methods;
  * tools: OpenAI function schemas (type "function", a valid name, parameters an object JSON Schema
    that compiles), unique names, JSON-serializable;
  * indices: each split a non-empty list of unique strings, the same on every call, splits disjoint,
    an unknown split raises `EnvError("bad_request")`, and so does `start` of an unknown index;
  * start: the same index gives the same initial messages (system/user, text content) and the same
    first expert move: episodes must be deterministic in their index;
  * malformed calls (bad JSON, unknown tool, arguments that are not an object, that fail the schema or
    are too long, no call at all): each answered with an observation, the episode still running, and
    the scripted expert can still finish it afterwards;
  * the expert: on the first `samples` indices of each split it ends every episode (a final status,
    a finite reward, answers that survive the wire) within the turn limit, solves at least
    `min_success` of them, and earns the same reward twice on the same index.

The built-in tasks pass the same function (tests/envs/test_envs_contract.py). It runs the task in
this process through `Session`, the layer the worker uses, so a failure here is a failure there.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from agentrl.serving.session import Session, ToolBox
from agentrl.serving.wire_types import InteractResult, StartResult
from agentrl.tasks.api import EnvError, Episode, Task
from agentrl.types import Status

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""What the OpenAI function-calling format allows as a function name."""


class ContractError(AssertionError):
    """A task broke one rule of the contract; the message says which, on which sample."""


@dataclass
class ContractReport:
    """What `check_task` saw: episodes played and solved by the expert, per split."""

    played: dict[str, int] = field(default_factory=dict)
    solved: dict[str, int] = field(default_factory=dict)
    turns: dict[str, float] = field(default_factory=dict)
    """Mean expert turns per episode."""


def _fail(rule: str, detail: str) -> None:
    raise ContractError(f"{rule}: {detail}")


def _check(cond: bool, rule: str, detail: str) -> None:
    if not cond:
        _fail(rule, detail)


def _wire(obj: Any, rule: str) -> None:
    try:
        json.dumps(obj)
    except (TypeError, ValueError) as e:
        _fail(rule, f"not JSON-serializable ({e}): {str(obj)[:200]}")


def _raises_bad_request(fn: Any, rule: str, what: str) -> None:
    try:
        fn()
    except EnvError as e:
        _check(e.code == "bad_request", rule, f"{what} raised EnvError({e.code!r}), expected 'bad_request'")
        return
    except Exception as e:  # noqa: BLE001 - the point is to name what the task raised instead
        _fail(rule, f"{what} raised {type(e).__name__}: {e}; raise EnvError('bad_request', ...) instead")
    _fail(rule, f"{what} did not raise; raise EnvError('bad_request', ...)")


def check_protocol(task: Task) -> None:
    _check(isinstance(task, Task), "protocol", f"{type(task).__name__} lacks name, max_turns, tools, indices or start")
    _check(isinstance(task.name, str) and bool(task.name), "protocol", "name must be a non-empty string")
    _check(isinstance(task.max_turns, int) and not isinstance(task.max_turns, bool) and task.max_turns >= 1,
           "protocol", f"max_turns must be an int >= 1, got {task.max_turns!r}")
    _check(isinstance(getattr(task, "blocking", False), bool), "protocol", "blocking must be a bool")


def check_tools(tools: Any) -> set[str]:
    """Checks one tool list; returns the tool names."""
    _check(isinstance(tools, list) and bool(tools), "tools", "tools() must return a non-empty list")
    names: set[str] = set()
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        _check(isinstance(tool, dict) and tool.get("type") == "function" and isinstance(fn, dict), "tools",
               f"each tool must be {{'type': 'function', 'function': {{...}}}}, got {str(tool)[:120]}")
        name = fn.get("name")
        _check(isinstance(name, str) and bool(TOOL_NAME.match(name)), "tools",
               f"function name {name!r} must match {TOOL_NAME.pattern}")
        _check(name not in names, "tools", f"two tools are named {name!r}")
        names.add(name)
        _check(isinstance(fn.get("description", ""), str), "tools", f"{name}: description must be a string")
        params = fn.get("parameters")
        _check(isinstance(params, dict) and params.get("type") == "object", "tools",
               f"{name}: parameters must be a JSON Schema with type 'object'")
    _wire(tools, "tools")
    try:
        ToolBox(tools)
    except Exception as e:  # noqa: BLE001
        _fail("tools", f"a parameters schema does not compile: {type(e).__name__}: {e}")
    return names


def check_indices(task: Task, splits: tuple[str, ...]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for split in splits:
        idx = task.indices(split)
        _check(isinstance(idx, list) and bool(idx) and all(isinstance(i, str) for i in idx), "indices",
               f"indices({split!r}) must be a non-empty list of strings")
        _check(len(set(idx)) == len(idx), "indices", f"indices({split!r}) has duplicates")
        _check(task.indices(split) == idx, "indices", f"indices({split!r}) differs between two calls")
        for other, seen in out.items():
            both = set(idx) & set(seen)
            _check(not both, "indices", f"splits {other!r} and {split!r} share {sorted(both)[:3]}")
        out[split] = idx
    _raises_bad_request(lambda: task.indices("no-such-split"), "indices", "indices('no-such-split')")
    _raises_bad_request(lambda: task.start("no-such-index"), "start", "start('no-such-index')")
    return out


def _check_start(session: Session, index: str) -> None:
    _check(isinstance(session.episode, Episode), "start", f"start({index!r}) returned no Episode "
           "(initial_messages, step, expert_message)")
    msgs = session.messages
    _check(bool(msgs) and all(isinstance(m, dict) and m.get("role") in ("system", "user")
                              and isinstance(m.get("content"), str) for m in msgs), "start",
           f"{index}: initial messages must be system/user messages with text content")
    _wire(StartResult("s", msgs, session.toolbox.tools).to_wire(), "start")


def _check_result(result: InteractResult, call_ids: set[str], where: str) -> None:
    _wire(result.to_wire(), "interact")
    for m in result.messages:
        _check(isinstance(m, dict) and m.get("role") in ("tool", "user") and isinstance(m.get("content"), str),
               "interact", f"{where}: answers must be tool or user messages with text content, got {str(m)[:120]}")
        if m["role"] == "tool":
            _check(m.get("tool_call_id") in call_ids, "interact",
                   f"{where}: tool message answers call {m.get('tool_call_id')!r}, not one of {sorted(call_ids)}")
    _check(math.isfinite(result.reward), "interact", f"{where}: reward {result.reward} is not finite")
    if result.done:
        _check(result.status != Status.RUNNING, "interact", f"{where}: ended with status running")
    else:
        _check(result.status == Status.RUNNING, "interact", f"{where}: status {result.status} but not done")


def _call_ids(message: dict[str, Any]) -> set[str]:
    ids = set()
    for i, c in enumerate(message.get("tool_calls") or []):
        ids.add(str(c.get("id") or f"call_{i}") if isinstance(c, dict) else f"call_{i}")
    return ids


def _expert_move(session: Session, where: str) -> dict[str, Any]:
    msg = session.expert_message()
    _check(isinstance(msg, dict) and msg.get("role", "assistant") == "assistant", "expert",
           f"{where}: expert_message() must return an assistant message, got {str(msg)[:120]}")
    _wire(msg, "expert")
    return msg


def play_expert(session: Session, where: str, max_steps: int,
                transcript: list[Any] | None = None) -> InteractResult:
    """The expert's episode to its end; returns the final result (the observations go to `transcript`)."""
    for turn in range(max_steps):
        msg = _expert_move(session, f"{where} turn {turn}")
        result = session.interact(msg)
        _check_result(result, _call_ids(msg), f"{where} turn {turn}")
        if transcript is not None:
            transcript.append([m.get("content") for m in result.messages])
        if result.done:
            return result
    _fail("expert", f"{where}: the episode did not end within {max_steps} expert turns")
    raise AssertionError  # unreachable


def malformed_moves(tools: list[dict[str, Any]], max_argument_bytes: int) -> list[tuple[str, dict[str, Any]]]:
    """Assistant messages every task must answer with an observation rather than an ending or a crash."""
    first = tools[0]["function"]
    name = first["name"]

    def call(fn_name: str, arguments: Any) -> dict[str, Any]:
        return {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_bad", "type": "function", "function": {"name": fn_name, "arguments": arguments}}]}

    moves = [("invalid JSON", call(name, '{"oops": ')), ("unknown tool", call("no_such_tool_xyz", "{}")),
             ("arguments not an object", call(name, "[1, 2]")),
             ("oversized arguments", call(name, json.dumps({"x": "a" * (max_argument_bytes + 1)})))]
    for tool in tools:  # arguments failing the schema: a required property left out
        required = tool["function"]["parameters"].get("required")
        if required:
            moves.append(("arguments failing the schema", call(tool["function"]["name"], "{}")))
            break
    return moves


def check_malformed(task: Task, index: str, max_steps: int, clean: InteractResult, clean_turns: int) -> None:
    """Each malformed move on a fresh episode of `index`, then the expert plays it out.

    The move must be answered with an observation; when the turn limit leaves room, the expert must
    then reach the same ending as without the move (a malformed call never touches the task's state).
    """
    probe = Session(task, index)
    moves = malformed_moves(probe.toolbox.tools, probe.toolbox.max_argument_bytes)
    if not hasattr(probe.episode, "text_step"):  # a plain-text reply is an action for some tasks
        moves.append(("no tool call", {"role": "assistant", "content": "I will not call a tool."}))
    if task.max_turns < 2:
        return
    for what, msg in moves:
        session = Session(task, index)
        result = session.interact(msg)
        where = f"{index}: {what}"
        _check_result(result, _call_ids(msg), where)
        _check(not result.done, "malformed", f"{where} ended the episode ({result.status}); answer with an "
               "observation so the model can correct itself")
        _check(bool(result.messages), "malformed", f"{where}: no observation came back")
        final = play_expert(session, f"{where}, then the expert", max_steps)
        if clean_turns + 1 <= task.max_turns:
            _check((final.reward, final.status) == (clean.reward, clean.status), "malformed",
                   f"{where}: the expert then got {final.reward} ({final.status}), without it {clean.reward} "
                   f"({clean.status}); a malformed call must leave the episode as it was")


def check_task(task: Task, samples: int = 20, splits: tuple[str, ...] = ("train", "test"),
               min_success: float = 0.9, max_steps: int = 200) -> ContractReport:
    """Run the whole contract on `task`; raises ContractError at the first broken rule.

    Args:
        task: an instance of the task class (what `get_task` builds).
        samples: indices per split played by the expert (the first ones).
        splits: the splits the task must have.
        min_success: fraction of those episodes the expert must end COMPLETED with reward > 0.
        max_steps: expert turns allowed per episode when max_turns is larger (tasks that never end on their own).
    Returns:
        What was played and solved, per split.
    """
    check_protocol(task)
    names = check_tools(task.tools())
    by_split = check_indices(task, splits)
    max_steps = min(task.max_turns, max_steps)
    report = ContractReport()
    for split, indices in by_split.items():
        played = solved = turns = 0
        for n, index in enumerate(indices[:samples]):
            session = Session(task, index)
            _check_start(session, index)
            own = {t["function"]["name"] for t in session.toolbox.tools}
            _check(own <= names, "tools", f"{index}: the episode's tools {sorted(own - names)} are not the task's")
            again = Session(task, index)
            _check(again.messages == session.messages and again.toolbox.tools == session.toolbox.tools, "start",
                   f"start({index!r}) twice gave different initial messages or tools")
            _check(_expert_move(again, index) == _expert_move(session, index), "start",
                   f"start({index!r}) twice gave different first expert moves")
            seen: list[Any] = []
            result = play_expert(session, index, max_steps, seen)
            if n == 0:
                seen_again: list[Any] = []
                twin = play_expert(again, f"{index} (again)", max_steps, seen_again)
                _check((twin.reward, twin.status) == (result.reward, result.status) and seen_again == seen, "start",
                       f"{index}: the expert's episode went differently the second time "
                       f"({result.reward} {result.status} in {len(seen)} turns, then {twin.reward} {twin.status} "
                       f"in {len(seen_again)}): episodes must be deterministic in their index")
                check_malformed(task, index, max_steps, result, session.turns)
            played += 1
            turns += session.turns
            solved += result.status == Status.COMPLETED and result.reward > 0
        need = math.ceil(min_success * played)
        _check(solved >= need, "expert", f"split {split!r}: the expert solved {solved} of {played} "
               f"(the contract asks {need}); fix the expert or the task")
        report.played[split], report.solved[split] = played, solved
        report.turns[split] = turns / max(played, 1)
    return report
