"""Reading what a policy wrote: a tool call's JSON arguments, and text on its way to a task or a tokenizer.

Python's `json.loads` accepts what JSON does not (NaN, Infinity, 1e999 read as inf, an unpaired
surrogate escape read as a string that no encoder will take) and raises what is not a parse error
(ValueError past 4,300 integer digits, RecursionError past ~1,000 levels). Each of those, written by a
policy, once went on as an exception of ours: a 502 `env_error` from the worker, a crashed rollout rank.
`loads_arguments` is the one rule every reader of a call uses (the rollout's parser, the env's `ToolBox`,
the faithful protocol): anything it refuses raises `ArgumentsError`, whose text completes "arguments are
..." for the model's error observation, and nothing else.

`clean_text` replaces unpaired surrogates (not text, but a str can hold them) so that a task or a
tokenizer downstream never meets one.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_ARGUMENT_DEPTH = 32
"""How deeply a call's JSON arguments may nest. No tool's schema needs more than a few levels; 4,000
levels (8 KB, within the size bound) once reached the parser's recursion limit and answered 502."""
MAX_INT_DIGITS = 4300
"""The longest integer literal read (Python's own default limit on int <-> str conversion): longer is
refused as the call's error, whatever `sys.set_int_max_str_digits` says in this process."""
_SURROGATE = re.compile("[\ud800-\udfff]")


class ArgumentsError(ValueError):
    """Why a call's arguments are refused; its text completes "arguments are ...". `decode` is the parser's
    own error where the text is not JSON at all (callers that always said it their way keep doing so)."""

    def __init__(self, message: str, decode: json.JSONDecodeError | None = None) -> None:
        super().__init__(message)
        self.decode = decode


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON `text`, by one pass that skips strings (valid or
    not: it only bounds what the parser would recurse into)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _int(literal: str) -> int:
    digits = len(literal) - literal.startswith("-")
    if digits > MAX_INT_DIGITS:
        raise ArgumentsError(f"not valid JSON here (an integer of {digits} digits; the limit is {MAX_INT_DIGITS})")
    try:
        return int(literal)
    except ValueError as e:  # a lower limit set in this process
        raise ArgumentsError(f"not valid JSON here ({e})") from None


def _float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise ArgumentsError(f"not valid JSON here (the number {literal[:40]} is out of range)")
    return value


def _constant(name: str) -> Any:
    raise ArgumentsError(f"not valid JSON ({name} is not a JSON number)")


def _with_surrogate(value: Any) -> str | None:
    """The first string (key or value) in `value` that holds an unpaired surrogate, else None."""
    if isinstance(value, str):
        return value if _SURROGATE.search(value) else None
    if isinstance(value, dict):
        for k, v in value.items():
            bad = _with_surrogate(k) or _with_surrogate(v)
            if bad is not None:
                return bad
    elif isinstance(value, list):
        for v in value:
            bad = _with_surrogate(v)
            if bad is not None:
                return bad
    return None


def loads_arguments(text: str, max_depth: int = MAX_ARGUMENT_DEPTH, finite: bool = True) -> Any:
    """`text` as JSON, or `ArgumentsError`: nested deeper than `max_depth`, not JSON, an integer of more
    than `MAX_INT_DIGITS` digits, a string holding an unpaired surrogate, and (`finite`) NaN, Infinity or
    a number out of float range. Never raises anything else."""
    depth = json_depth(text)
    if depth > max_depth:
        raise ArgumentsError(f"nested too deeply ({depth} levels, limit {max_depth})")
    try:
        value = json.loads(text, parse_int=_int, parse_float=_float if finite else float,
                           parse_constant=_constant if finite else None)
    except ArgumentsError:
        raise
    except json.JSONDecodeError as e:
        raise ArgumentsError(f"not valid JSON ({e.msg} at position {e.pos})", e) from None
    except (ValueError, TypeError, RecursionError) as e:  # not reached under the bounds above; kept so that
        raise ArgumentsError(f"not valid JSON ({type(e).__name__})") from None  # no input is our exception
    bad = _with_surrogate(value)
    if bad is not None:
        where = _SURROGATE.search(bad)
        code = f"\\u{ord(where.group()):04x}" if where else "?"
        raise ArgumentsError(f"not valid JSON here (an unpaired surrogate {code} is not text)")
    return value


def clean_text(text: str) -> str:
    """`text` with each unpaired surrogate replaced by U+FFFD (a tokenizer, a database or a file refuses
    them; a str from JSON can hold them)."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


def clean_message(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message from the wire with unpaired surrogates replaced in its text, call ids and tool
    names (`clean_text`); the arguments stay as sent, for the call's reader to refuse (`loads_arguments`)."""
    out = dict(message)
    if isinstance(out.get("content"), str):
        out["content"] = clean_text(out["content"])
    calls = out.get("tool_calls")
    if isinstance(calls, list):
        out["tool_calls"] = [_clean_call(c) for c in calls]
    return out


def _clean_call(call: Any) -> Any:
    if not isinstance(call, dict):
        return call
    out = {k: clean_text(v) if k == "id" and isinstance(v, str) else v for k, v in call.items()}
    fn = out.get("function")
    if isinstance(fn, dict) and isinstance(fn.get("name"), str):
        out["function"] = {**fn, "name": clean_text(fn["name"])}
    return out
