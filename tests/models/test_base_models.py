"""Base models as their GGUFs come: no chat template, and a generation config naming only the eos.

Loading one names the template that fits its vocabulary (`standins.BASE`: Gemma's, Llama-3's and ChatML's turn
tokens, or none at all: plain-tools); with it every task's expert episode round-trips through the template and the
parser, strict; the template's turn end (`<end_of_turn>`, `<|eot_id|>`, `<|im_end|>`, the eos) is a stop token
though the directory never listed it; and `jobs.check_model` fails on a template whose turn end no stop can match."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.config import ModelConfig, chat_template_text
from agentrl.models import standins
from agentrl.rollout.chat import ChatFormat
from agentrl.rollout.model_check import check
from tests.job_cli import run_job

TURN_END = {"gemma-base": "<end_of_turn>", "llama3-base": "<|eot_id|>", "chatml-base": "<|im_end|>",
            "plain-base": "</s>"}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("base")
    return {name: standins.build(name, root / name) for name in standins.BASE}


@pytest.mark.parametrize("family", list(standins.BASE))
def test_a_base_model_without_a_template_is_told_the_template_that_fits(base, family: str) -> None:
    fix = standins.BASE[family].fix
    with pytest.raises(ValueError, match=f"it has none .*Set model.chat_template={fix} \\("):
        ChatFormat.load(base[family])


@pytest.mark.parametrize("family", list(standins.BASE))
def test_the_chosen_templates_turn_end_is_a_stop_and_every_task_round_trips(base, family: str) -> None:
    fam = standins.BASE[family]
    fmt, results = check(base[family], ["lookup", "unlock", "db"], ModelConfig(chat_template=fam.fix))
    assert all(not isinstance(r, tuple) and r.ok for r in results), results
    stops = [fmt.tokenizer.convert_ids_to_tokens(i) for i in fmt.stop_ids]
    assert stops[0] == fam.eos  # the directory's own stop first, as before
    assert set(stops) == {fam.eos, TURN_END[family]}, stops
    assert fmt.tokenizer.convert_ids_to_tokens(fmt.turn_end) == TURN_END[family]


def test_own_tools_on_a_model_without_a_template_names_ours(base) -> None:
    with pytest.raises(ValueError, match="has none .*plain-tools"):
        ChatFormat.load(base["plain-base"], chat_template="own-tools")


def test_check_model_fails_when_the_templates_turn_end_is_not_a_stop(base, tmp_path) -> None:
    """A template that closes the model's turns with plain text: no stop token can end them."""
    text = tmp_path / "text-end.jinja"
    text.write_text(chat_template_text("plain-tools").replace("{{- eos_token + '\\n\\n' -}}", "{{- '\\n\\n' -}}"))
    run = run_job("check_model", str(base["plain-base"]), f"model.chat_template={text}", "--tasks", "lookup")
    assert run.returncode == 1, run.stderr[-2000:]
    assert "turn end   the chat template closes an assistant turn with text" in run.stdout and "<- FAILED" in run.stdout
    run = run_job("check_model", str(base["plain-base"]), "model.chat_template=plain-tools", "--tasks", "lookup")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "turn end   </s> (1), a stop token" in run.stdout


def test_make_model_converts_and_verifies_a_gguf_without_a_chat_template(tmp_path) -> None:
    """A base model's GGUF (no template) is verified on raw text, and the output names the template that fits."""
    from tests.models.gguf_standin import write_gguf

    small = standins.build("llama3-base", tmp_path / "src", num_layers=1)
    gguf_file = write_gguf(small, tmp_path / "base.gguf")
    out = tmp_path / "converted"
    run = run_job("make_model", "--from-gguf", str(gguf_file), str(out))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    printed = run.stdout
    assert "tensors equal to the GGUF's, rounded to bfloat16: True" in printed
    assert "top-1 agreement 1.000" in printed
    assert "greedy reply to 'The capital of France is' (raw text: no chat template)" in printed
    assert "it has none" in printed and "Set model.chat_template=llama3-tools" in printed
    v = json.loads((out / "gguf_verification.json").read_text())
    assert v["chat_template"] is False and v["prompt"] == "The capital of France is"
    # the template it names works on the converted directory, its <|eot_id|> a stop
    fmt = ChatFormat.load(out, chat_template="llama3-tools")
    assert fmt.tokenizer.convert_ids_to_tokens(fmt.turn_end) == "<|eot_id|>" and fmt.turn_end in fmt.stop_ids
