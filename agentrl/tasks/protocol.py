"""How `Session` turns an assistant message into the tool calls an episode sees: two protocols.

*strict* (our default, training-friendly): every tool call of a message is checked against its tool's
JSON Schema; an invalid one is answered with an "Error: ..." observation and never reaches the task.

*faithful* (AgentBench-FC's behaviour, the default for `source: agentbench`): AgentBench-FC's task
servers check nothing but that the arguments parse as JSON, several of them act on `tool_calls[0]`
only (os, alfworld, webshop) and most read a call's argument as `list(arguments.values())[0]` whatever
its key. A task reproduces that by giving its episode (or itself) a `call_policy` attribute:

    call_policy = CallPolicy(first_call_only=True, lenient_arguments=True)

  * `first_call_only`: the calls after the first are dropped before anything else happens (they get no
    answer, as in AgentBench-FC);
  * `lenient_arguments`: no schema check and no tool-name check; each call reaches `Episode.step` as a
    `ToolCall` whose `arguments` are whatever JSON the model sent (an object, a list, a number), and
    whose `error` says why they did not parse (then `arguments` is None). The episode answers each call
    with its own (AgentBench's) messages, e.g. through `first_value`.

`Session` reads the policy with `policy_of(episode, task)`; episodes without one get `STRICT`. This
module imports only the standard library and `json_args`, so `agentrl.serving.session` can import it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrl.tasks.json_args import ArgumentsError, loads_arguments

PROTOCOLS = ("faithful", "strict")


@dataclass(frozen=True)
class CallPolicy:
    """What `Session` checks before an episode sees a message's tool calls (module docstring)."""

    first_call_only: bool = False
    lenient_arguments: bool = False


STRICT = CallPolicy()


def policy_of(episode: Any, task: Any) -> CallPolicy:
    """The episode's `call_policy`, else the task's, else `STRICT`."""
    for owner in (episode, task):
        policy = getattr(owner, "call_policy", None)
        if isinstance(policy, CallPolicy):
            return policy
    return STRICT


def select_calls(raw_calls: list[Any], policy: CallPolicy) -> list[Any]:
    """The raw tool calls the policy lets through (all, or the first)."""
    return raw_calls[:1] if policy.first_call_only else raw_calls


def parse_lenient(raw: Any, i: int, max_bytes: int) -> tuple[str, str, Any, str | None]:
    """(id, name, arguments, error) of one raw tool call, parsed as AgentBench-FC does: `json.loads` of
    the arguments string and nothing more (a dict is taken as already parsed; NaN passes), except that
    nesting, huge integers and unpaired surrogates are the call's error, never an exception
    (`json_args.loads_arguments`). Arguments longer than
    `max_bytes` are refused unparsed all the same: a bound on the worker's work, not a protocol rule."""
    call_id = str(raw.get("id") or f"call_{i}") if isinstance(raw, dict) else f"call_{i}"
    fn = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(fn, dict):
        return call_id, "", None, "the tool call has no function"
    name = fn.get("name") if isinstance(fn.get("name"), str) else ""
    arguments = fn.get("arguments")
    if isinstance(arguments, (dict, list)):
        return call_id, name, arguments, None
    if not isinstance(arguments, str):
        return call_id, name, None, "arguments are not JSON (not a string)"
    if len(arguments.encode(errors="surrogatepass")) > max_bytes:
        return call_id, name, None, f"arguments are too long (limit {max_bytes} bytes)"
    try:  # AgentBench's json.loads, but nothing a policy writes raises past this
        return call_id, name, loads_arguments(arguments, finite=False), None
    except ArgumentsError as e:  # not JSON: in this protocol's own words, as before
        return call_id, name, None, f"arguments are not JSON ({e.decode})" if e.decode else f"arguments are {e}"


def first_value(arguments: Any) -> Any:
    """AgentBench-FC's `list(arguments.values())[0]`: the first argument's value, whatever its key.

    Raises ValueError where AgentBench's expression raises (no arguments, or not a JSON object), so an
    episode can answer as AgentBench's `except` branch does.
    """
    if not isinstance(arguments, dict) or not arguments:
        raise ValueError("the call has no argument")
    return next(iter(arguments.values()))


def resolve_protocol(protocol: str | None, agentbench_source: bool, task: str) -> str:
    """The protocol a task runs: the one asked for, else faithful for AgentBench's data, else strict."""
    if protocol is None or protocol == "":
        return "faithful" if agentbench_source else "strict"
    if protocol not in PROTOCOLS:
        raise ValueError(f"{task}: unknown protocol {protocol!r} ({' | '.join(PROTOCOLS)})")
    return protocol
