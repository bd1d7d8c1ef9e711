"""What a chat template does with tools, found by rendering probe conversations: whether the tool schemas reach
the prompt, how an assistant's tool call is written, whether a tool result is shown, and which of vLLM's
tool parsers reads that call back.

A template that ignores `tools` renders a prompt the same with and without them, and the model never learns
the task's tools exist (every episode then ends at the turn limit); one that ignores `tool_calls` turns the
scripted expert's demonstrations into empty turns. `ChatFormat.of` refuses both at load, naming the template
that fits the model's turns (`suggest_template`). The parser `auto` picks is the first candidate that reads the
template's own call back (name and arguments), so a model whose family we never named still gets a parser
that fits what it is shown, and a parser that cannot read it is never chosen silently.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentrl.rollout.tool_calls import PARSER_BY_TYPE, ParsedTurn, ToolCallParser

PROBE_ARG = "zebra-4417"
PROBE_RESULT = "result-8093"
PROBE_TOOL = {"type": "function", "function": {
    "name": "probe_lookup", "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}
PROBE_CALL = {"id": "call_0", "type": "function",
              "function": {"name": "probe_lookup", "arguments": {"word": PROBE_ARG}}}
_MARK = "<<agentrl:probe-turn>>"
_CHAT = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Look the word up."}]
# Call syntaxes by their markers (checked in order): a family's tokens in the vocabulary, the template's text.
CALL_MARKERS: tuple[tuple[str, str], ...] = (
    ("<tool_call>", "hermes"), ("<|python_tag|>", "llama3_json"), ("[TOOL_CALLS]", "mistral"),
    ("<arg_key>", "glm45"), ("<function=", "qwen3_coder"), ("functools[", "phi4_mini_json"))
# Our templates by the turn tokens of the families they are written for (the first whose tokens all appear).
TEMPLATE_BY_TOKENS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("<|im_start|>", "<|im_end|>"), "chatml-tools"), (("<start_of_turn>", "<end_of_turn>"), "gemma-tools"),
    (("<|user|>", "<|assistant|>", "<|end|>"), "phi3-tools"),
    (("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"), "llama3-tools"))
PLAIN_TEMPLATE = "plain-tools"
"""Ours for a model with no template and none of those turn tokens (a base model): plain-text turns, each of the
model's closed by its eos."""

Render = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, bool], str]


@dataclass
class TemplateFeatures:
    tools: bool = False
    """The tool schemas reach the prompt (it differs with and without `tools`, and names the tool)."""
    call_text: str | None = None
    """An assistant turn holding one tool call, as the template writes it (None: the call is not rendered)."""
    results: bool = False
    """A `tool` message's content is rendered."""
    errors: list[str] = field(default_factory=list)
    """What the template raised on (e.g. a system message, or the `tool` role)."""

    def problems(self) -> list[str]:
        out = list(self.errors)
        if not self.errors:
            if not self.tools:
                out.append("it ignores `tools` (a prompt renders the same with and without them): the model would "
                           "never see the task's tools")
            if self.call_text is None:
                out.append("it does not render an assistant message's `tool_calls`")
            if not self.results:
                out.append("it does not render `tool` messages (the tools' results)")
        return out


def probe(render: Render) -> TemplateFeatures:
    """Render the probe conversations through `render(messages, tools, add_generation_prompt)`."""
    f = TemplateFeatures()
    try:
        without = render(_CHAT, None, True)
        with_tools = render(_CHAT, [PROBE_TOOL], True)
    except Exception as e:  # noqa: BLE001 - a template raising is what the probe reports
        f.errors.append(f"it raised on a system and a user message: {type(e).__name__}: {e}")
        return f
    f.tools = with_tools != without and "probe_lookup" in with_tools
    result = {"role": "tool", "tool_call_id": "call_0", "content": PROBE_RESULT}
    try:
        whole = render(_CHAT + [{"role": "assistant", "content": "", "tool_calls": [PROBE_CALL]}, result],
                       [PROBE_TOOL], False)
        marked = render(_CHAT + [{"role": "assistant", "content": _MARK}, result], [PROBE_TOOL], False)
    except Exception as e:  # noqa: BLE001
        f.errors.append(f"it raised on an assistant tool call and its `tool` result: {type(e).__name__}: {e}")
        return f
    f.results = PROBE_RESULT in whole
    if PROBE_ARG in whole:
        before, _, after = marked.partition(_MARK)
        if whole.startswith(before) and whole.endswith(after) and len(before) + len(after) <= len(whole):
            f.call_text = whole[len(before):len(whole) - len(after)]  # the assistant turn's own text
        else:  # a template that renders a call turn unlike a plain one: the text around the call
            end = whole.find(PROBE_RESULT, len(with_tools))
            f.call_text = whole[len(with_tools) if whole.startswith(with_tools) else 0:end]
    return f


def suggest_template(vocab: dict[str, int], template: str = "") -> tuple[str, tuple[str, ...]] | None:
    """(our template for the model's turn tokens, those tokens), by its vocabulary or its own template's text."""
    for tokens, name in TEMPLATE_BY_TOKENS:
        if all(t in vocab or t in template for t in tokens):
            return name, tokens
    return None


def parser_candidates(model_type: str, vocab: dict[str, int], call_text: str) -> list[str]:
    """Parsers worth trying, most likely first: by the call's markers in the template's text, by call tokens in
    the vocabulary, by `model_type`, then hermes (the syntax of agentrl's own templates)."""
    out = [name for marker, name in CALL_MARKERS if marker in call_text]
    out += [name for marker, name in CALL_MARKERS if marker in vocab]
    if '"parameters"' in call_text:
        out.append("llama3_json")
    if model_type in PARSER_BY_TYPE:
        out.append(PARSER_BY_TYPE[model_type])
    out += ["hermes", "llama3_json", "pythonic"]
    return list(dict.fromkeys(out))


def seen(model_type: str, vocab: dict[str, int], call_text: str | None) -> str:
    """What parser selection saw, in words (for the log and the errors)."""
    tokens = [m for m, _ in CALL_MARKERS[:3] if m in vocab]
    call = " ".join(call_text.split())[:160] if call_text else None
    return (f"model_type {model_type or '(none)'!r}; call tokens in the vocabulary: {', '.join(tokens) or 'none of '}"
            + ("" if tokens else ", ".join(m for m, _ in CALL_MARKERS[:3]))
            + (f"; the template writes a call as {call!r}" if call else "; the template writes no tool call"))


def reads_probe_call(turn: ParsedTurn) -> bool:
    """Whether a parsed turn is exactly the probe's call (its name and its one argument)."""
    if turn.errors or len(turn.tool_calls) != 1:
        return False
    fn = turn.tool_calls[0]["function"]
    return fn["name"] == "probe_lookup" and json.loads(fn["arguments"]) == {"word": PROBE_ARG}


def choose_parser(requested: str, tokenizer: Any, model_type: str, call_text: str) -> tuple[ToolCallParser, str]:
    """The tool parser for `model.tool_parser` (`requested`), checked to read back the call the template writes.

    auto: the first of `parser_candidates` that does. Returns (the parser, what was seen and chosen, in words);
    raises ValueError naming the field, what was seen, what each candidate did, and what to set."""
    vocab = tokenizer.get_vocab()
    names = parser_candidates(model_type, vocab, call_text) if requested == "auto" else [requested]
    tried = []
    for name in names:
        try:
            parser = ToolCallParser(name, tokenizer)
        except ValueError as e:
            if requested != "auto":
                raise
            tried.append(f"{name}: {str(e).split(': ', 2)[-1]}")
            continue
        turn = parser.parse(call_text, [PROBE_TOOL])
        if reads_probe_call(turn):
            how = "auto: " if requested == "auto" else ""
            return parser, f"{how}{name} reads back the chat template's own call ({seen(model_type, vocab, call_text)})"
        got = (f"errors {[e.message for e in turn.errors]}" if turn.errors else
               f"calls {[c['function'] for c in turn.tool_calls]}" if turn.tool_calls else "no call")
        tried.append(f"{name}: read {got}")
    head = ("auto found no vLLM tool parser that reads back" if requested == "auto" else
            f"{requested!r} does not read back")
    saw = seen(model_type, vocab, call_text)
    raise ValueError(f"model.tool_parser: {head} the tool call the chat template writes ({saw}). "
                     f"Tried {'; '.join(tried)}. Set model.tool_parser to the vLLM parser of that syntax, or "
                     "model.chat_template to a template whose calls one reads (agentrl's own write <tool_call> JSON: "
                     "hermes)")
