"""The model's own format (`ChatFormat`, `Transcript`): prompts are the tokenizer's `apply_chat_template`,
observations the template's delta, calls in each family's syntax reach the env with their arguments, bad
calls become observations, and the whole-render check finds templates that change earlier turns.

Stand-in models of three families (agentrl.models.standins) plus the tiny model's own format."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.models import standins
from agentrl.rollout.chat import SAMPLED, ChatFormat, TemplateMismatch, Transcript, model_stop_ids

TOOLS = [
    {"type": "function", "function": {"name": "lookup", "description": "Find an item.", "parameters": {
        "type": "object", "properties": {"name": {"type": "string", "description": "the item's name"},
                                         "field": {"type": "string", "enum": ["code", "color"]}},
        "required": ["name"]}}},
    {"type": "function", "function": {"name": "submit_answer", "description": "Answer.", "parameters": {
        "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}},
]
START = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "What is the code of bako?"}]


def _call(tool: str, **args: str) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c0", "type": "function", "function": {"name": tool, "arguments": json.dumps(args)}}]}


@pytest.fixture(scope="module")
def families(tmp_path_factory) -> dict[str, ChatFormat]:
    root = tmp_path_factory.mktemp("standins")
    return {f: ChatFormat.load(standins.build(f, root / f), check_mode="strict") for f in standins.FAMILIES}


@pytest.mark.parametrize("family", list(standins.FAMILIES))
def test_the_first_prompt_is_the_tokenizers_own_template(families, family: str) -> None:
    fmt = families[family]
    want = fmt.tokenizer.apply_chat_template(START, tools=TOOLS, add_generation_prompt=True, tokenize=True)
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
    assert Transcript(fmt, START, TOOLS).prompt == list(want)
    text = fmt.decode(Transcript(fmt, START, TOOLS).prompt)
    assert '"enum": ["code", "color"]' in text and "the item's name" in text  # whole schemas, not signatures


@pytest.mark.parametrize("family, parser", [(f, standins.FAMILIES[f].parser) for f in standins.FAMILIES])
def test_auto_picks_the_familys_parser_and_stop_tokens(families, family: str, parser: str) -> None:
    fmt = families[family]
    assert fmt.parser.name == parser
    stops = {fmt.tokenizer.convert_ids_to_tokens(i) for i in fmt.stop_ids}
    assert stops == set(standins.FAMILIES[family].stops) | {standins.FAMILIES[family].eos}


@pytest.mark.parametrize("family", list(standins.FAMILIES))
def test_multi_turn_episode_matches_the_whole_render(families, family: str) -> None:
    """Expert calls, two tool results at once (grouped by Qwen's template), an error observation, a final
    answer: every context segment equals the whole conversation's rendering, and parses come back whole."""
    fmt = families[family]
    talk = Transcript(fmt, START, TOOLS)
    for msg, obs in [(_call("lookup", name="bako", field="code"),
                      [{"role": "tool", "content": "code=41"}, {"role": "tool", "content": "color=red"}]),
                     (_call("lookup", name="bako"), [{"role": "tool", "content": "name=bako code=41"}]),
                     (_call("submit_answer", answer="41"), None)]:
        ids = fmt.assistant_ids(msg, TOOLS)
        parsed = fmt.parse(ids, TOOLS)
        assert parsed.errors == [] and [c["function"]["name"] for c in parsed.tool_calls] == [
            msg["tool_calls"][0]["function"]["name"]]
        assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == json.loads(
            msg["tool_calls"][0]["function"]["arguments"])
        talk.sampled(ids)
        if obs is not None:
            delta = talk.observation_ids(obs)
            talk.observed(obs, delta)
    assert talk.check() == []
    assert talk.verify("lookup") == 0
    text = fmt.decode([i for _, seg in talk.segments for i in seg])
    assert "code=41" in text and "color=red" in text and SAMPLED not in text


def test_a_cut_turn_gets_the_templates_turn_end_before_the_observation(families) -> None:
    fmt = families["qwen2.5"]
    talk = Transcript(fmt, START, TOOLS)
    talk.sampled(fmt.encode("I will look"))  # stopped at the token limit: no <|im_end|>
    delta = talk.observation_ids(fmt.error_observation([]))
    assert fmt.decode(delta).startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\nError: ")
    talk.observed(fmt.error_observation([]), delta)
    assert talk.check() == []


@pytest.mark.parametrize("family, text, args", [
    ("qwen2.5", '<tool_call>\n{"name": "lookup", "arguments": {"name": "bako"}}\n</tool_call><|im_end|>', {"name": "bako"}),
    ("llama3.1", '{"name": "lookup", "parameters": {"name": "bako", "field": "code"}}<|eot_id|>',
     {"name": "bako", "field": "code"}),
    ("llama3.1", '<|python_tag|>{"name": "lookup", "parameters": {"name": "bako"}}<|eom_id|>', {"name": "bako"}),
    ("glm4", "<tool_call>lookup\n<arg_key>name</arg_key>\n<arg_value>bako</arg_value>\n</tool_call><|observation|>",
     {"name": "bako"}),
])
def test_calls_in_each_familys_syntax_keep_their_arguments(families, family: str, text: str, args: dict) -> None:
    fmt = families[family]
    p = fmt.parse(fmt.encode(text), TOOLS)
    assert p.errors == [] and len(p.tool_calls) == 1
    assert p.tool_calls[0]["function"]["name"] == "lookup"
    assert json.loads(p.tool_calls[0]["function"]["arguments"]) == args


@pytest.mark.parametrize("family, text, needle", [
    ("qwen2.5", '<tool_call>\n{"name": "lookup", "arguments": {"name": </tool_call><|im_end|>', "not valid JSON"),
    ("qwen2.5", '<tool_call>{"arguments": {}}</tool_call><|im_end|>', 'string "name"'),
    ("qwen2.5", '<tool_call>{"name": "lookup", "arguments": "bako"}</tool_call><|im_end|>', "must be a JSON object"),
    ("qwen2.5", '<tool_call>["lookup"]</tool_call><|im_end|>', 'string "name"'),
    ("llama3.1", '<|python_tag|>{"name": "lookup", "parameters": {"name": <|eom_id|>', "could not be read"),
    ("glm4", "<tool_call>lookup\n<arg_key>name</arg_key>\n<arg_value>bako\n<|observation|>", "not closed"),
])
def test_a_call_that_cannot_be_read_is_an_error_observation(families, family: str, text: str, needle: str) -> None:
    fmt = families[family]
    p = fmt.parse(fmt.encode(text), TOOLS)
    assert p.tool_calls == [] and len(p.errors) == 1 and needle in p.errors[0].message, p
    (obs,) = fmt.error_observation(p.errors)
    assert obs["role"] == "tool" and obs["content"].startswith("Error: ") and needle in obs["content"]
    assert fmt.parser.syntax in obs["content"]  # tells the model its own call syntax


@pytest.mark.parametrize("family", list(standins.FAMILIES))
def test_plain_text_is_content_not_a_call(families, family: str) -> None:
    fmt = families[family]
    p = fmt.parse(fmt.encode("The answer is 41.") + [fmt.stop_ids[0]], TOOLS)
    assert p.tool_calls == [] and p.errors == [] and p.content == "The answer is 41."
    assert "tool_calls" not in p.to_message()


def test_a_template_that_rewrites_earlier_turns_is_caught(families, tmp_path: Path) -> None:
    """A template whose system prompt counts the messages (as date or reasoning-stripping templates change
    what came before) renders each prefix differently from the whole: strict raises, warn counts."""
    base = families["qwen2.5"]
    tok = base.tokenizer
    tok2 = type(tok).from_pretrained(tok.name_or_path) if tok.name_or_path else tok
    tok2.chat_template = tok.chat_template.replace("'\\n\\n# Tools", "(messages | length | string) + '\\n\\n# Tools")
    for mode, expect in [("strict", TemplateMismatch), ("warn", None)]:
        fmt = ChatFormat.of(tok2, "hermes", base.stop_ids, check_mode=mode, model_type="qwen2")
        talk = Transcript(fmt, START, TOOLS)
        talk.sampled(base.assistant_ids(_call("lookup", name="bako"), TOOLS))
        obs = [{"role": "tool", "content": "code=41"}]
        talk.observed(obs, talk.observation_ids(obs))
        talk.sampled(base.assistant_ids(_call("submit_answer", answer="41"), TOOLS))
        assert talk.check() and "prompt" in talk.check()[0]
        if expect is None:
            assert talk.verify("lookup") == 1
        else:
            with pytest.raises(expect, match="lookup: the episode's tokens differ"):
                talk.verify("lookup")


def test_stop_tokens_come_from_generation_config_and_a_missing_one_fails_naming_the_field(families, tmp_path) -> None:
    fmt = families["llama3.1"]
    d = Path(fmt.tokenizer.name_or_path)
    ids = model_stop_ids(fmt.tokenizer, d, ("<|python_tag|>",))
    assert fmt.tokenizer.convert_tokens_to_ids("<|python_tag|>") in ids and len(ids) == 4
    with pytest.raises(ValueError, match="model.stop_tokens: '<|im_end|>' is not in the tokenizer's vocabulary"):
        model_stop_ids(fmt.tokenizer, d, ("<|im_end|>",))


def test_a_parser_that_does_not_fit_the_vocabulary_fails_at_load(families) -> None:
    qwen = families["qwen2.5"].tokenizer  # no <|python_tag|>: vLLM's llama3_json cannot be built
    with pytest.raises(ValueError, match="model.tool_parser: vLLM's 'llama3_json' parser does not fit"):
        ChatFormat.of(qwen, "llama3_json")
    with pytest.raises(ValueError, match="model.tool_parser: vLLM has no tool parser named 'nope'"):
        ChatFormat.of(qwen, "nope")


def test_the_tiny_models_format_is_unchanged(lookup_format) -> None:
    """The demo's model goes through the same path: its prompt, a call and the observation after it are the
    compact format it was built with (tools as one-line signatures, results under `tool`)."""
    fmt = lookup_format
    talk = Transcript(fmt, START, TOOLS)
    assert fmt.decode(talk.prompt) == ("<|im_start|>system\nYou are an agent.\n<tools>\nlookup(name: string, field?: "
                                       "string): Find an item.\nsubmit_answer(answer: string): Answer.\n</tools>"
                                       "<|im_end|>\n<|im_start|>user\nWhat is the code of bako?<|im_end|>\n"
                                       "<|im_start|>assistant\n")
    ids = fmt.assistant_ids(_call("lookup", name="bako"), TOOLS)
    assert fmt.decode(ids) == '<tool_call>{"name": "lookup", "arguments": {"name": "bako"}}</tool_call><|im_end|>'
    talk.sampled(ids)
    obs = [{"role": "tool", "content": "code=41"}]
    delta = talk.observation_ids(obs)
    assert fmt.decode(delta) == "\n<|im_start|>tool\ncode=41<|im_end|>\n<|im_start|>assistant\n"
    p = fmt.parse(ids, TOOLS)
    assert p.errors == [] and json.loads(p.tool_calls[0]["function"]["arguments"]) == {"name": "bako"}


TEXTS = ["", "plain words, and: punctuation!", "  leading  and trailing  ", "ünïcødé ✓ 数字 41",
         '<tool_call>\n{"name": "lookup", "arguments": {"name": "bako"}}\n</tool_call>']


@pytest.mark.parametrize("family", [*standins.FAMILIES, "tiny"])
def test_encode_and_decode_are_the_tokenizers_own(families, lookup_format, family: str) -> None:
    """`ChatFormat.encode`/`decode` take the fast tokenizer's backend directly when transformers would add
    nothing around it: the ids and texts must be exactly transformers' own, special tokens included."""
    fmt = lookup_format if family == "tiny" else families[family]
    assert fmt._backend is not None and fmt._decoder is not None  # the fast path is the one under test
    talk = Transcript(fmt, START, TOOLS)
    talk.sampled(fmt.assistant_ids(_call("lookup", name="bako"), TOOLS))
    rendered = fmt.render(talk.messages + [{"role": "tool", "content": "code=41"}], TOOLS, True)
    specials = "".join(fmt.tokenizer.convert_ids_to_tokens(sorted(fmt._special_ids())[:6]))
    for text in [*TEXTS, rendered, specials + TEXTS[1] + specials]:
        ids = fmt.encode(text)
        assert ids == fmt.tokenizer.encode(text, add_special_tokens=False), text
        assert fmt.decode(ids) == fmt.tokenizer.decode(ids, skip_special_tokens=False), text


def test_unread_call_observation_names_the_family_and_the_reason_for_plain_content() -> None:
    from agentrl.rollout.tool_calls import unread_call_observation

    assert unread_call_observation("The answer is 7.") is None
    bad = unread_call_observation('<tool_call>\n{"name": "lookup", "arguments": {"a": "b": "c"}}\n</tool_call>')
    assert bad is not None and "not valid JSON" in bad and '<tool_call>{"name": ...' in bad
    assert "not closed with </tool_call>" in unread_call_observation('<tool_call>{"name": "x"')
    assert "<arg_key>" in unread_call_observation("<tool_call>lookup\n<arg_key>a</arg_key>\n</tool_call>")
    assert '"parameters"' in unread_call_observation('<|python_tag|>{"name": "x", "parameters": 3}')
