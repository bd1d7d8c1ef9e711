"""The chat format of agentrl's own tiny model: a compact Hermes-shaped template saved with its tokenizer.

The rollout never renders this format itself: like any model's, it is the chat template in the tokenizer
(`CHAT_TEMPLATE`, applied through `agentrl.rollout.chat.ChatFormat`), and tool calls are read by vLLM's
`hermes` parser. The Python `render` below exists for one reason: the tokenizer is trained on rendered
conversations before any tokenizer exists to apply a template; a test keeps it equal to the template.

    <|im_start|>system\n{system}\n<tools>\n{one signature line per tool}\n</tools><|im_end|>\n
    <|im_start|>user\n{content}<|im_end|>\n
    <|im_start|>assistant\n{content}<tool_call>{"name": ..., "arguments": {...}}</tool_call><|im_end|>\n
    <|im_start|>tool\n{content}<|im_end|>\n
    <|im_start|>assistant\n                      <- generation prompt

Compact on purpose: a model trained from scratch in minutes attends over a short prompt far more easily
than over JSON schemas (the env still validates arguments against the full schema).
"""
from __future__ import annotations

import json
from typing import Any

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
CALL_START = "<tool_call>"
CALL_END = "</tool_call>"
EOS = "<|endoftext|>"
SPECIAL_TOKENS = [EOS, IM_START, IM_END, CALL_START, CALL_END]
GENERATION_PROMPT = f"{IM_START}assistant\n"
# The fixed JSON around tool-call arguments, as whole tokens for tokenizers trained here: tool calls get
# 3x shorter, and a name copied from the question into a call is fewer tokens away from its source.
CALL_SCAFFOLD = ['{"name": "', '", "arguments": {"', '": "', '", "', '"}}', '"}']


def argument_key_tokens(tools: list[dict[str, Any]]) -> list[str]:
    """Each argument key of `tools` with the JSON that follows it (`field": "`), for tokenizers trained here.

    As one token, the key itself tells the model which argument comes next: without it, every string
    argument is predicted after the same `": "` token, and a small model has to look one token back to
    know whether to copy the name or the field from the question (a far later-learned skill).
    """
    keys: dict[str, None] = {}
    for tool in tools:
        for key, spec in ((tool["function"].get("parameters") or {}).get("properties") or {}).items():
            keys[f'{key}": "' if spec.get("type") == "string" else f'{key}": '] = None
    return list(keys)


def _tool_call_text(name: str, arguments: str) -> str:
    """Canonical text of one call; `arguments` is the OpenAI-style JSON string."""
    args = json.dumps(json.loads(arguments), ensure_ascii=False) if arguments.strip() else "{}"
    return f'{CALL_START}{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {args}}}{CALL_END}'


def tool_signature(tool: dict[str, Any]) -> str:
    """One line per tool: `name(arg: type, opt?: type): description`.

    Compact on purpose: a small model attends over a short prompt far more easily than over JSON
    schemas, and the arguments are still validated against the full JSON Schema by the env.
    """
    f = tool["function"]
    params = f.get("parameters") or {}
    required = set(params.get("required") or [])
    args = ", ".join(f"{k}{'' if k in required else '?'}: {v.get('type', 'any')}"
                     for k, v in (params.get("properties") or {}).items())
    return f"{f['name']}({args}): {f.get('description', '')}"


def render_message(msg: dict[str, Any], tools: list[dict[str, Any]] | None = None) -> str:
    role, content = msg["role"], msg.get("content") or ""
    if role == "system":
        text = content
        if tools:
            lines = "\n".join(tool_signature(t) for t in tools)
            text += ("\n" if text else "") + f"<tools>\n{lines}\n</tools>"
        return f"{IM_START}system\n{text}{IM_END}\n"
    if role == "assistant":
        calls = "".join(_tool_call_text(c["function"]["name"], c["function"]["arguments"])
                        for c in msg.get("tool_calls") or [])
        return f"{IM_START}assistant\n{content}{calls}{IM_END}\n"
    if role in ("user", "tool"):
        return f"{IM_START}{role}\n{content}{IM_END}\n"
    raise ValueError(f"unknown message role {role!r}")


def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
           add_generation_prompt: bool = False) -> str:
    """The whole conversation as text (tools go into the system message; one is added if missing)."""
    out = []
    if tools and (not messages or messages[0]["role"] != "system"):
        out.append(render_message({"role": "system", "content": ""}, tools))
    out += [render_message(m, tools if i == 0 else None) for i, m in enumerate(messages)]
    if add_generation_prompt:
        out.append(GENERATION_PROMPT)
    return "".join(out)


# The same format as a Jinja template for tokenizer_config.json (kept equal to `render` by a test).
# transformers renders with trim_blocks, which eats a newline right after a block tag, so every newline
# is written as the expression {{ nl }}.
CHAT_TEMPLATE = (
    "{% set nl = '\\n' %}"
    "{% if tools and (messages | length == 0 or messages[0]['role'] != 'system') %}"
    "<|im_start|>system{{ nl }}<tools>{% for t in tools %}{{ nl }}{{ t['function']['name'] }}({% set p = t['function'].get('parameters') or {} %}{% set req = p.get('required') or [] %}{% for k, v in (p.get('properties') or {}).items() %}{{ k }}{% if k not in req %}?{% endif %}: {{ v.get('type', 'any') }}{% if not loop.last %}, {% endif %}{% endfor %}): {{ t['function'].get('description', '') }}{% endfor %}"
    "{{ nl }}</tools><|im_end|>{{ nl }}"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}"
    "<|im_start|>system{{ nl }}{{ m['content'] or '' }}"
    "{% if tools and loop.first %}{% if m['content'] %}{{ nl }}{% endif %}<tools>{% for t in tools %}{{ nl }}{{ t['function']['name'] }}({% set p = t['function'].get('parameters') or {} %}{% set req = p.get('required') or [] %}{% for k, v in (p.get('properties') or {}).items() %}{{ k }}{% if k not in req %}?{% endif %}: {{ v.get('type', 'any') }}{% if not loop.last %}, {% endif %}{% endfor %}): {{ t['function'].get('description', '') }}{% endfor %}"
    "{{ nl }}</tools>{% endif %}"
    "<|im_end|>{{ nl }}"
    "{% elif m['role'] == 'assistant' %}"
    "<|im_start|>assistant{{ nl }}{{ m['content'] or '' }}"
    "{% for c in m.get('tool_calls') or [] %}"
    "<tool_call>{\"name\": {{ c['function']['name'] | tojson }}, \"arguments\": "
    "{% if c['function']['arguments'] is string %}{{ c['function']['arguments'] }}"
    "{% else %}{{ c['function']['arguments'] | tojson }}{% endif %}"
    "}</tool_call>"
    "{% endfor %}"
    "<|im_end|>{{ nl }}"
    "{% else %}"
    "<|im_start|>{{ m['role'] }}{{ nl }}{{ m['content'] or '' }}<|im_end|>{{ nl }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{{ nl }}{% endif %}"
)
