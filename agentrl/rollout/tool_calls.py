"""Reading tool calls out of sampled text with vLLM's own parsers (`ToolParserManager`), chosen per model.

The parser is the one vLLM's OpenAI server would use for the model (`--tool-call-parser NAME`), so a
policy trained here is read the same way when it is served. Around it this module adds what training
needs and a server does not: a turn that clearly tried to call a tool but could not be read (the parser
found nothing, raised, or returned arguments that are not a JSON object) comes back as `ToolCallError`s,
which the agent loop turns into an error observation the model can learn from. Parsing never raises on
model output.

`auto` (`template_probe.choose_parser`) takes the first parser that reads back the call the model's chat template
writes, trying first those the call's markers, the vocabulary's call tokens and `model_type` (`PARSER_BY_TYPE`)
point to.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from agentrl.tasks.json_args import MAX_ARGUMENT_DEPTH, ArgumentsError, loads_arguments

log = logging.getLogger("agentrl.rollout.tool_calls")

# model_type (config.json) -> the vLLM tool parser its family's templates call for: Qwen2/2.5 and Qwen3 write
# Hermes-style `<tool_call>` JSON, Llama-3.x JSON after `<|python_tag|>` (or bare), GLM-4.x
# `<tool_call>name<arg_key>..`.
# Only a hint for `auto`: a llama-type model may well be shown another syntax (SmolLM2 with a ChatML template).
PARSER_BY_TYPE: dict[str, str] = {
    "qwen2": "hermes", "qwen2_moe": "hermes", "qwen3": "hermes", "qwen3_moe": "hermes",
    "llama": "llama3_json", "glm4": "glm45", "glm4_moe": "glm45", "glm": "glm45", "mistral": "mistral",
}

# How each family's text shows that the model tried a call (a call the parser then could not read is an
# error for the model to see, not plain content), and how the error observation tells it the syntax.
_MARKERS: dict[str, tuple[str, ...]] = {
    "hermes": ("<tool_call>",), "glm45": ("<tool_call>",), "glm47": ("<tool_call>",),
    "qwen3_xml": ("<tool_call>",), "qwen3_coder": ("<tool_call>",), "llama3_json": ("<|python_tag|>", '{"name"'),
    "mistral": ("[TOOL_CALLS]",),
}
_SYNTAX: dict[str, str] = {
    "hermes": '<tool_call>{"name": ..., "arguments": {...}}</tool_call>',
    "llama3_json": '{"name": ..., "parameters": {...}}',
    "glm45": "<tool_call>NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>\n</tool_call>",
    "glm47": "<tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value></tool_call>",
}


@dataclass
class ToolCallError:
    """A tool call the model wrote that could not be read; `message` is shown to the model."""

    text: str
    message: str


@dataclass
class ParsedTurn:
    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    errors: list[ToolCallError] = field(default_factory=list)

    def to_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg


class ToolCallParser:
    """One vLLM tool parser for one tokenizer; `parse` reads a whole assistant turn."""

    def __init__(self, name: str, tokenizer: Any) -> None:
        from vllm.tool_parsers import ToolParserManager

        try:
            cls = ToolParserManager.get_tool_parser(name)
        except KeyError as e:
            raise ValueError(f"model.tool_parser: vLLM has no tool parser named {name!r}") from e
        try:
            self._parser = cls(tokenizer)
        except Exception as e:  # e.g. llama3_json without <|python_tag|> in the vocabulary
            raise ValueError(f"model.tool_parser: vLLM's {name!r} parser does not fit this tokenizer: {e}") from e
        self._module = cls.__module__
        self.name = name
        self.markers = _MARKERS.get(name, ())
        self._requests: dict[int, tuple[Any, Any]] = {}

    @property
    def syntax(self) -> str:
        """The call syntax that error observations show the model."""
        return _SYNTAX.get(self.name, "this model's tool-call format")

    def _request(self, tools: list[dict[str, Any]]) -> Any:
        key = id(tools)
        hit = self._requests.get(key)
        if hit is None or hit[0] is not tools:
            from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

            hit = (tools, ChatCompletionRequest(model="agentrl", messages=[], tools=tools or None))
            if len(self._requests) > 256:  # one entry per distinct tool list; tasks reuse theirs
                self._requests.clear()
            self._requests[key] = hit
        return hit[1]

    def parse(self, text: str, tools: list[dict[str, Any]], call_id_prefix: str = "call") -> ParsedTurn:
        """Content and calls of one turn's text (stop tokens already removed). Never raises on model output."""
        quiet = logging.getLogger(self._module)
        if quiet.level != logging.CRITICAL:
            # vLLM's parsers log a traceback for every call they cannot read; here that is the model's everyday
            # mistake, answered with an error observation, so their logs would bury the run's own. Checked at
            # every parse, not set once: starting a vLLM engine (after the format was loaded and its parser
            # probed) configures its loggers again.
            quiet.setLevel(logging.CRITICAL)
        if "<tool_call>" in self.markers and text.count("<tool_call>") != text.count("</tool_call>"):
            # A call cut short: some parsers read what they can of it (GLM's drops the unclosed argument),
            # which would send the env a call the model never finished.
            return ParsedTurn(text.strip(), [], [ToolCallError(text, "tool call is not closed with </tool_call>")])
        try:
            info = self._parser.extract_tool_calls(text, self._request(tools))
        except Exception as e:  # noqa: BLE001 - a parser failing on odd output is the model's error, not ours
            log.debug("tool parser %s raised on %r: %s", self.name, text[:200], e)
            return ParsedTurn(text.strip(), [], [_unreadable(text)])
        if not info.tools_called:
            tried = any(m in text for m in self.markers)
            if tried:
                return ParsedTurn(text.strip(), [], [_unreadable(text)])
            return ParsedTurn(text.strip())
        calls, errors = [], []
        for c in info.tool_calls:
            name, arguments = c.function.name, c.function.arguments or "{}"
            try:  # the env's own rule (a 4,301-digit integer once raised out of the rank here)
                args = loads_arguments(arguments) if isinstance(arguments, str) else None
            except ArgumentsError as e:
                why = f"not valid JSON ({e.decode.msg})" if e.decode is not None else str(e)
                errors.append(ToolCallError(arguments, f"tool call arguments are {why}"))
                continue
            if not isinstance(name, str) or not name:
                errors.append(ToolCallError(arguments, 'a tool call needs a string "name"'))
            elif not isinstance(args, dict):
                errors.append(ToolCallError(arguments, f'the arguments of {name} must be a JSON object'))
            else:
                calls.append({"id": f"{call_id_prefix}_{len(calls)}", "type": "function",
                              "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}})
        return ParsedTurn((info.content or "").strip(), calls, errors)

    def format_errors(self, errors: list[ToolCallError]) -> str:
        return error_text(errors, self.syntax)


def error_text(errors: list[ToolCallError], syntax: str) -> str:
    """The error observation's text: what was wrong with the turn's calls, and the syntax to write them in."""
    return "Error: " + "; ".join(e.message for e in errors) + f". Write tool calls as {syntax}."


def unread_call_observation(text: str) -> str | None:
    """For a reply that an endpoint's server returned as plain content: the error observation the local path
    would answer it with when it tried a call in some family's syntax (None: no call was tried). The family is
    read off the text, since an endpoint does not say which parser it ran: `<tool_call>{` Hermes JSON,
    `<tool_call>NAME` GLM, `<|python_tag|>` or a bare `{"name"` Llama-3 JSON, `[TOOL_CALLS]` Mistral."""
    if "<tool_call>" in text:
        body = text.split("<tool_call>", 1)[1].lstrip()
        name = "hermes" if not body or body[0] in "{[" else "glm45"
    else:
        name = next((n for n in ("llama3_json", "mistral") if any(m in text for m in _MARKERS[n])), "")
        if not name:
            return None
    return error_text([_unreadable(text)], _SYNTAX.get(name, "this model's tool-call format"))


def _unreadable(text: str) -> ToolCallError:
    return ToolCallError(text, diagnose(text) or "the tool call could not be read")


def diagnose(text: str) -> str | None:
    """Why the first `<tool_call>…</tool_call>` JSON body in `text` does not read as a call (None: no such body,
    or it reads fine). Parsers only say that they failed; the model learns faster from the reason."""
    start, end = "<tool_call>", "</tool_call>"
    if start not in text:
        return None
    after = text.split(start, 1)[1]
    if end not in after:
        return f"tool call is not closed with {end}"
    body = after.split(end, 1)[0].strip()
    if body and body[0] not in "{[":  # GLM-style `name<arg_key>…`: nothing to say about JSON
        return None
    try:  # one level more than the arguments: the call's own object
        obj = loads_arguments(body, MAX_ARGUMENT_DEPTH + 1)
    except ArgumentsError as e:
        if e.decode is not None:
            return f"tool call is not valid JSON ({e.decode.msg} at char {e.decode.pos})"
        return f"tool call is {e}"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return 'tool call must be a JSON object with a string "name"'
    if not isinstance(obj.get("arguments", obj.get("parameters", {})), dict):
        return 'tool call "arguments" must be a JSON object'
    if "arguments" not in obj:
        return 'tool call has no "arguments"'
    return None
