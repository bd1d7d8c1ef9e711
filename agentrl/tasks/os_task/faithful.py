"""AgentBench-FC's `os` protocol, read from the user's AgentBench checkout at run time.

This project does not copy AgentBench's prompts or tool descriptions: `load_prompts` reads them from
the checkout (the tools from `configs/tasks/os.yaml`, the system prompt and the user prompt's template
from `src/server/tasks/os_interaction/task.py`, parsed with `ast`, never imported or executed).

`parse_action` reproduces how AgentBench's `OSInteraction._handle_agent_action` reads one assistant
message (`Session` passes it unchecked under the episode's `CallPolicy`): only the first tool call
counts; its arguments are parsed as JSON and their *values* taken in order, whatever their keys;
`finish_action`'s first value (the thought) is the committed answer.
The observation strings below are AgentBench's protocol text (what its task answers), reproduced so
that a faithful episode answers the same.

Where the files live in a checkout (AgentBench's own layout):
  data/os_interaction/data/{1..7}/*.json + data/os_interaction/scripts/{1..7}/   test ("os-std")
  data/os_interaction/train_0317/training.json + data/os_interaction/scripts/7/   train ("os-env_train")
  data/os_interaction/data/dev.json + data/os_interaction/scripts/dev/            dev
"""
from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CONFIG = "configs/tasks/os.yaml"
TASK_SOURCE = "src/server/tasks/os_interaction/task.py"

NO_CALL = "No executable tool calls found. Please call a tool instead"
INVALID_CALL = "Invalid function call. Please call a tool instead"
OUTPUT_PREFIX = "The output of the OS:\n\n"
EMPTY_OUTPUT = "The output of the OS is empty."
TRUNCATED = "\n[truncated because the output is too long]"


@dataclass(frozen=True)
class OsPrompts:
    """What a faithful episode shows the model, as the checkout says."""

    tools: list[dict[str, Any]]
    system_prompt: str
    user_template: str
    """The first user message with "{description}" where the problem goes."""

    def user_prompt(self, description: str) -> str:
        return self.user_template.replace("{description}", description)


def load_prompts(checkout: Path) -> OsPrompts:
    """Tools, system prompt and user prompt of AgentBench's os task, from `checkout`."""
    config_path, source_path = checkout / CONFIG, checkout / TASK_SOURCE
    for p in (config_path, source_path):
        if not p.is_file():
            raise FileNotFoundError(f"os: the faithful protocol reads {p.relative_to(checkout)} from the AgentBench "
                                    f"checkout {checkout}, and it is not there (or use protocol='strict')")
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    try:
        tools = list(config["default"]["parameters"]["tools"])
    except (KeyError, TypeError) as e:
        raise ValueError(f"{config_path}: no default.parameters.tools ({e})") from e
    system, user = _prompts(source_path.read_text(encoding="utf-8"))
    return OsPrompts(tools=tools, system_prompt=system, user_template=user)


def _prompts(source: str) -> tuple[str, str]:
    """The `system_message` string and the user f-string of `_inject_initial_messages`."""
    tree = ast.parse(source)
    fn = next((n for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef | ast.FunctionDef)
               and n.name == "_inject_initial_messages"), None)
    if fn is None:
        raise ValueError(f"{TASK_SOURCE}: no _inject_initial_messages (AgentBench changed; use protocol='strict')")
    system = next((n.value.value for n in ast.walk(fn) if isinstance(n, ast.Assign)
                   and any(isinstance(t, ast.Name) and t.id == "system_message" for t in n.targets)
                   and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)), None)
    user = None
    for n in ast.walk(fn):
        if isinstance(n, ast.JoinedStr):
            parts = []
            for v in n.values:
                if isinstance(v, ast.Constant):
                    parts.append(str(v.value))
                elif isinstance(v, ast.FormattedValue) and isinstance(v.value, ast.Name):
                    parts.append("{" + v.value.id + "}")
            if "{description}" in parts:
                user = "".join(parts)
    if system is None or user is None:
        raise ValueError(f"{TASK_SOURCE}: the system prompt or the user prompt template was not found")
    return system, user


@dataclass
class RawAction:
    """One assistant message as AgentBench reads it.

    kind: "none" (no tool call), "error" (arguments did not parse: `text` is the error AgentBench shows),
        "invalid" (a function AgentBench does not know), "crash" (AgentBench's task raises: a bash_action
        or answer_action without arguments), "bash" (`content` is the script; not a string: AgentBench
        runs nothing and shows empty output), "commit" (`content` is the answer, None for a bare finish).
    """

    kind: str
    call_id: str | None = None
    name: str = ""
    content: Any = None
    text: str = ""


def parse_action(message: dict[str, Any]) -> RawAction:
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list) or not calls:
        return RawAction("none")
    call = calls[0] if isinstance(calls[0], dict) else {}
    fn = call.get("function") if isinstance(call.get("function"), dict) else {}
    name = str(fn.get("name") or "")
    call_id = call.get("id")
    try:
        arguments = fn.get("arguments")
        parsed = arguments if isinstance(arguments, dict) else json.loads(arguments)
        values = list(parsed.values())  # AgentBench: the values, whatever the keys
    except Exception as e:  # AgentBench answers str(e) as the tool message
        return RawAction("error", call_id, name, text=str(e))
    if name == "bash_action":
        return RawAction("bash", call_id, name, values[0]) if values else RawAction("crash", call_id, name)
    if name == "finish_action":
        return RawAction("commit", call_id, name, values[0] if values else None)
    if name == "answer_action":
        return RawAction("commit", call_id, name, values[0]) if values else RawAction("crash", call_id, name)
    return RawAction("invalid", call_id, name)


def observation(output: str | None) -> str:
    """AgentBench's tool message for a bash_action's output (cut at 800 characters to 780)."""
    text = output or ""
    if len(text) > 800:
        text = text[:780] + TRUNCATED
    return OUTPUT_PREFIX + text if text else EMPTY_OUTPUT
