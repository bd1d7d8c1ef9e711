"""A model brought as it comes: a template that lays out no tools is refused at load, naming the template to set;
`model.chat_template` replaces it (agentrl's templates by name, a .jinja file, another model's directory); `auto`
takes the parser that reads the template's own call back, whatever the model type says.

Tool-less stand-ins (agentrl.models.standins.TOOLLESS): SmolLM2-like ChatML on a Llama architecture, Gemma-like
turns that also refuse a system message, Phi-3-like turns, and Zephyr-like turns agentrl has no template for
(own-tools: their own template, given the tools)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.config import ConfigError, ModelConfig, chat_template_names, chat_template_text, load_config
from agentrl.models import standins
from agentrl.rollout.chat import ChatFormat
from agentrl.rollout.model_check import check
from agentrl.rollout.template_probe import probe


@pytest.fixture(scope="module")
def toolless(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("toolless")
    return {name: standins.build(name, root / name) for name in standins.TOOLLESS}


@pytest.mark.parametrize("family", [f for f, fam in standins.TOOLLESS.items() if fam.fix])
def test_a_toolless_template_fails_at_load_naming_the_template_that_fits(toolless, family: str) -> None:
    fix = standins.TOOLLESS[family].fix
    with pytest.raises(ValueError, match=f"^model.chat_template: .*Set model.chat_template={fix} \\(") as e:
        ChatFormat.load(toolless[family])
    assert "jobs.eval" in str(e.value) and "jobs.check_model" in str(e.value)
    if family == "gemma":  # its own template refuses the task's system message
        assert "System role not supported" in str(e.value)
    else:
        assert "ignores `tools`" in str(e.value)


@pytest.mark.parametrize("family", [f for f, fam in standins.TOOLLESS.items() if fam.fix])
def test_with_our_template_every_task_round_trips_through_the_families_turns(toolless, family: str) -> None:
    """jobs.check_model's check, strict: the expert's calls written by the template, read back by the parser
    auto chose (hermes, for a Llama-type model too), answered by the task; the episode equals a whole re-render."""
    fam = standins.TOOLLESS[family]
    fmt, results = check(toolless[family], ["lookup", "unlock", "db"], ModelConfig(chat_template=fam.fix))
    assert fmt.parser.name == "hermes" and "reads back the chat template's own call" in fmt.parser_note
    assert all(not isinstance(r, tuple) and r.ok for r in results), results
    stops = {fmt.tokenizer.convert_ids_to_tokens(i) for i in fmt.stop_ids}
    assert stops == set(fam.stops) | {fam.eos}


def test_a_family_we_have_no_template_for_gets_a_generic_fix_and_takes_a_users_file(toolless, tmp_path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(toolless["zephyr"]))  # Zephyr turns that refuse a system message too
    tok.chat_template = ("{%- if messages[0]['role'] == 'system' -%}{{ raise_exception('System role not supported') }}"
                         "{%- endif -%}" + tok.chat_template)
    with pytest.raises(ValueError, match="a .jinja file or a model directory") as e:
        ChatFormat.of(tok)
    assert all(name in str(e.value) for name in chat_template_names())
    # the user's own template for Zephyr turns: ChatML's structure with the family's tokens
    text = chat_template_text("chatml-tools").replace("<|im_start|>", "<|").replace("<|im_end|>", "</s>")
    text = text.replace("'<|' + m['role'] + '\\n'", "'<|' + m['role'] + '|>\\n'")
    for role in ("system", "user", "assistant"):
        text = text.replace(f"'<|{role}", f"'<|{role}|>")
    mine = tmp_path / "zephyr-tools.jinja"
    mine.write_text(text)
    fmt, results = check(toolless["zephyr"], ["lookup"], ModelConfig(chat_template=str(mine)))
    assert fmt.parser.name == "hermes" and all(not isinstance(r, tuple) and r.ok for r in results), results
    assert "<|user|>\nWhat" in fmt.decode(fmt.prompt_ids([{"role": "user", "content": "What?"}], None))


def test_the_template_can_come_from_another_models_directory_or_its_tokenizer_config(toolless, tmp_path) -> None:
    qwen = standins.build("qwen2.5", tmp_path / "qwen")
    fmt = ChatFormat.load(toolless["smollm2"], chat_template=str(qwen))  # Qwen2.5's template: ChatML turns too
    assert fmt.parser.name == "hermes"
    # a tokenizer_config.json holding named templates: the tool_use one is taken
    cfg = tmp_path / "tokenizer_config.json"
    cfg.write_text(json.dumps({"chat_template": [{"name": "default", "template": "{{ messages }}"},
                                                 {"name": "tool_use", "template": chat_template_text("chatml-tools")}]}))
    assert chat_template_text(str(cfg)) == chat_template_text("chatml-tools")
    assert ChatFormat.load(toolless["smollm2"], chat_template=str(cfg)).parser.name == "hermes"


def test_auto_takes_the_parser_the_templates_call_reads_with_and_a_wrong_one_fails_naming_what_it_read(toolless) -> None:
    fmt = ChatFormat.load(toolless["smollm2"], chat_template="chatml-tools")
    assert "model_type 'llama'" in fmt.parser_note and "<tool_call>" in fmt.parser_note  # not llama3_json
    with pytest.raises(ValueError, match="model.tool_parser: 'pythonic' does not read back .* Tried pythonic: read no call"):
        ChatFormat.load(toolless["smollm2"], tool_parser="pythonic", chat_template="chatml-tools")
    with pytest.raises(ValueError, match="vLLM's 'llama3_json' parser does not fit"):  # no <|python_tag|>
        ChatFormat.load(toolless["smollm2"], tool_parser="llama3_json", chat_template="chatml-tools")


def test_the_probe_sees_tools_calls_and_results(toolless) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(toolless["smollm2"]))

    def render(messages, tools, gen):
        return tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=gen)

    own = probe(render)
    assert not own.tools and own.call_text is None and own.results  # ChatML renders the tool role, nothing else
    tok.chat_template = chat_template_text("chatml-tools")
    ours = probe(render)
    assert ours.tools and ours.results and ours.call_text.startswith("<tool_call>\n{\"name\": \"probe_lookup\"")


def test_model_chat_template_is_checked_at_config_load(tmp_path) -> None:
    assert load_config(None, ["model.chat_template=chatml-tools"]).model.chat_template == "chatml-tools"
    with pytest.raises(ConfigError, match="model.chat_template: 'nope' is neither one of agentrl's templates "
                                          r"\(chatml-tools, gemma-tools, llama3-tools, own-tools, phi3-tools, plain-tools\)"):
        load_config(None, ["model.chat_template=nope"])
    with pytest.raises(ConfigError, match="model.chat_template: .* holds neither chat_template.jinja"):
        load_config(None, [f"model.chat_template={tmp_path}"])


def test_own_tools_gives_a_familys_own_turns_the_tools_calls_and_results(toolless, tmp_path) -> None:
    import shutil

    from agentrl.rollout.template_probe import PROBE_TOOL

    fmt = ChatFormat.load(toolless["zephyr"], chat_template="own-tools")
    call = {"id": "c0", "type": "function", "function": {"name": "probe_lookup", "arguments": {"word": "x"}}}
    chat = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Look it up."},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c0", "content": "a"}, {"role": "tool", "tool_call_id": "c0", "content": "b"}]
    text = fmt.render(chat, [PROBE_TOOL], True)
    assert text.startswith("<|system|>\nYou are an agent.\n\n# Tools\n\nYou can call the functions below.")
    assert '"name": "probe_lookup"' in text.split("</s>")[0]  # the schema, inside the family's system turn
    assert '<|assistant|>\n<tool_call>\n{"name": "probe_lookup", "arguments": {"word": "x"}}\n</tool_call></s>\n' in text
    assert text.endswith("<|user|>\n<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response></s>\n"
                         "<|assistant|>\n")  # one run of results: one user turn
    no_system = fmt.render(chat[1:2], [PROBE_TOOL], True)
    assert no_system.startswith("<|user|>\n# Tools\n") and "\n\nLook it up.</s>" in no_system
    assert fmt.render(chat[:2], None, True) == "<|system|>\nYou are an agent.</s>\n<|user|>\nLook it up.</s>\n<|assistant|>\n"
    # a directory published with it (chat_template.jinja holds the wrapped template) is not wrapped twice
    wrapped = chat_template_text("own-tools", toolless["zephyr"])
    published = shutil.copytree(toolless["zephyr"], tmp_path / "published")
    (published / "chat_template.jinja").write_text(wrapped)
    assert chat_template_text("own-tools", published) == wrapped
    with pytest.raises(ValueError, match="own-tools wraps the model directory's own template"):
        chat_template_text("own-tools")
    (published / "chat_template.jinja").unlink()
    (published / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    with pytest.raises(ValueError, match=r"own-tools gives the model directory's own template the tools, and .* has "
                                         r"none \(.*\): name one of agentrl's templates \(chatml-tools, gemma-tools, "
                                         r"llama3-tools, phi3-tools, plain-tools\)"):
        chat_template_text("own-tools", published)


def test_a_family_template_on_a_vocabulary_without_its_turn_tokens_fails_naming_one_that_fits(toolless) -> None:
    """chatml-tools (say, a preset's) on a Zephyr-style model: <|im_start|> would be text the model never saw, and
    it would never stop on <|im_end|>."""
    with pytest.raises(ValueError, match=r"model.chat_template=chatml-tools writes turns of <\|im_start\|>, "
                                         r"<\|im_end\|>, and the tokenizer of .*zephyr has no <\|im_start\|>, "
                                         r"<\|im_end\|> token: .* Set model.chat_template=own-tools \("):
        ChatFormat.load(toolless["zephyr"], chat_template="chatml-tools")
    with pytest.raises(ValueError, match=r"has no <start_of_turn>, <end_of_turn> token: .* Set "
                                         r"model.chat_template=chatml-tools \(this model's"):
        ChatFormat.load(toolless["smollm2"], chat_template="gemma-tools")
