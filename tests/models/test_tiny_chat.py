"""The tiny model's chat format: the Python rendering (the tokenizer's training text) equals the Jinja
template saved with the tokenizer, and its tool-call JSON is whole tokens."""
from __future__ import annotations

import json

import pytest

from agentrl.models import tiny
from agentrl.models import tiny_chat as chat

TOOLS = [
    {"type": "function", "function": {"name": "lookup", "description": "Find an item.", "parameters": {
        "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}},
    {"type": "function", "function": {"name": "submit_answer", "description": "Answer.", "parameters": {
        "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}},
]


def _call(i: int, tool: str, **args: str) -> dict:
    return {"id": f"call_{i}", "type": "function", "function": {"name": tool, "arguments": json.dumps(args)}}


CONVERSATION = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "What is the code of bako?"},
    {"role": "assistant", "content": "", "tool_calls": [_call(0, "lookup", name="bako")]},
    {"role": "tool", "tool_call_id": "call_0", "name": "lookup", "content": "name=bako code=41"},
    {"role": "assistant", "content": "Found it.", "tool_calls": [_call(1, "submit_answer", answer="41")]},
    {"role": "user", "content": "Thanks ünïcödé"},
]


@pytest.fixture(scope="module")
def tokenizer():
    corpus = [chat.render(CONVERSATION, TOOLS)] * 20
    return tiny.train_tokenizer(corpus, 400, chat.SPECIAL_TOKENS, chat.CHAT_TEMPLATE, chat.EOS, chat.EOS)


@pytest.mark.parametrize("n", [1, 2, 4, 5, 6])
@pytest.mark.parametrize("gen", [True, False])
def test_jinja_template_equals_python_render(tokenizer, n: int, gen: bool) -> None:
    msgs = CONVERSATION[:n]
    want = chat.render(msgs, TOOLS, add_generation_prompt=gen)
    got = tokenizer.apply_chat_template(msgs, tools=TOOLS, tokenize=False, add_generation_prompt=gen)
    assert got == want


def test_jinja_template_without_system_message(tokenizer) -> None:
    msgs = CONVERSATION[1:3]
    assert tokenizer.apply_chat_template(msgs, tools=TOOLS, tokenize=False) == chat.render(msgs, TOOLS)


def test_render_shape() -> None:
    text = chat.render(CONVERSATION[:3], TOOLS, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are an agent.\n<tools>\nlookup(name: string): Find an item.\n"
                           "submit_answer(answer: string): Answer.\n</tools><|im_end|>\n")
    assert '<tool_call>{"name": "lookup", "arguments": {"name": "bako"}}</tool_call><|im_end|>\n' in text
    assert text.endswith("<|im_start|>assistant\n")


def test_special_tokens_are_single_tokens(tokenizer) -> None:
    for t in chat.SPECIAL_TOKENS:
        assert len(tokenizer.encode(t, add_special_tokens=False)) == 1


def test_tool_call_scaffold_is_whole_tokens(lookup_format) -> None:
    tok = lookup_format.tokenizer
    ids = lookup_format.assistant_ids({"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "lookup", "arguments": '{"name": "buro", "field": "code"}'}}]},
        TOOLS)
    body = tok.decode(ids)
    pieces = tok.convert_ids_to_tokens(ids)
    assert pieces == ["<tool_call>", '{"name": "', "lookup", '", "arguments": {"', 'name": "', "buro", '", "',
                      'field": "', "code", '"}}', "</tool_call>", "<|im_end|>"]
    assert tok.decode(tok.encode(body, add_special_tokens=False)) == body


def test_argument_key_tokens_follow_the_schema_types() -> None:
    tools = TOOLS + [{"type": "function", "function": {"name": "move", "parameters": {
        "type": "object", "properties": {"steps": {"type": "integer"}, "name": {"type": "string"}}}}}]
    assert chat.argument_key_tokens(tools) == ['name": "', 'answer": "', 'steps": ']


def test_saved_tokenizer_loads_with_the_same_split(lookup_tokenizer, tmp_path) -> None:
    """transformers rebuilds a qwen2 directory's tokenizer with Qwen2's own pre-tokenizer (so does vLLM):
    the ids it gives must be the ids training used, numbers and whole tokens included."""
    from transformers import AutoTokenizer

    model = tiny.build_model(lookup_tokenizer, 64, 1, 1, 128, 256, seed=0)
    text = ('<|im_start|>user\nWhat is the "price" of "buro"?<|im_end|>\n<|im_start|>tool\n47 1999<|im_end|>\n'
            '<|im_start|>assistant\n<tool_call>{"name": "submit_answer", "arguments": {"answer": "47"}}</tool_call><|im_end|>')
    tiny.save(model, lookup_tokenizer, tmp_path, probe=text)
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    assert loaded.encode(text) == lookup_tokenizer.encode(text)
    assert loaded.convert_ids_to_tokens(loaded.encode("47"))[-2:] == ["4", "7"]  # Qwen2 splits digits


def test_system_message_without_content_renders_like_the_template(tokenizer) -> None:
    msgs = [{"role": "system", "content": ""}, CONVERSATION[1]]
    assert tokenizer.apply_chat_template(msgs, tools=TOOLS, tokenize=False) == chat.render(msgs, TOOLS)
