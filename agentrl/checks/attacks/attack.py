"""One attack: its type (`Attack`) and the assistant messages it is made of (`call`, `calls`, `text`).

What every module of attacks builds on (`library`, `channels`, `resources`) and what the runner plays.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Message = dict[str, Any] | Callable[[list[dict[str, Any]], list[dict[str, Any]]], dict[str, Any]]


@dataclass(frozen=True)
class Attack:
    """One hostile episode: `messages` in order (the episode may end earlier), on `index` of `task`."""

    name: str
    task: str
    what: str
    messages: tuple[Message, ...]
    """Assistant messages, or functions of (the episode's first messages, the last observations) that
    make one (an attack that must name what the task showed, e.g. kg's relations)."""
    index: str = ""
    """"" = the task's first test index (else its first train index)."""
    problem: dict[str, Any] | None = field(default=None, hash=False)
    """os only: an AgentBench-format sample played instead of the index's."""
    after: Callable[[Any], str] | None = field(default=None, hash=False, compare=False)
    """A look at the task once the episode ended (its session closed): "" when nothing of the session
    outlived it, else what did (the player reports the worker hurt)."""
    probe: Callable[[Any], str] | None = field(default=None, hash=False, compare=False)
    """A look at the task from outside while the session still lives, after its messages: "" when its
    neighbours are unharmed, else how they are (the player reports the worker hurt)."""
    max_acts: int = 0
    """When > 0: the most tool results of one message that may have acted (an answer not starting with
    "Error"); more is a finding (a protocol that acts on one call per message acted on several)."""


def call(name: str, args: Any, call_id: str = "c0") -> dict[str, Any]:
    arguments = args if isinstance(args, str) else json.dumps(args)
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]}


def calls(named: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for i, (n, a) in enumerate(named)]}


def text(content: str) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def host_file_table_problems() -> list[str]:
    """What a probe reports about the host's open-file table while an attack holds what it could: a problem when
    it is more than 90 % full (the kernel's own count, /proc/sys/fs/file-nr); none when it cannot be read."""
    try:
        used, _, limit = (int(x) for x in Path("/proc/sys/fs/file-nr").read_text().split())
    except (OSError, ValueError):
        return []
    return [f"the host's file table is {used} of {limit}"] if used > 0.9 * limit else []
