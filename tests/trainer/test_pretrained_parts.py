"""The trainer's side of a model brought as it comes: a warm start with nothing to learn from says how every
demonstration ended; published and exported directories carry the run's chat template; `freeze_layers` leaves
the embedding and the lower layers out of the backward pass."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agentrl.config import TrainerConfig, chat_template_text, dump_config, load_config
from agentrl.models import standins
from agentrl.trainer import export
from agentrl.trainer.model_load import freeze_lower, load_model
from agentrl.trainer.warm_start import WarmStart
from agentrl.transport import weights as weights_io
from agentrl.types import Status, TrajectoryBuilder


def _demo(i: int, task: str, status: Status, n: int) -> object:
    b = TrajectoryBuilder()
    b.add_context(list(range(n)))
    return b.build(traj_id=f"d{i}", task=task, index=str(i), group_id=f"g{i}", reward=0.0, status=status,
                   num_turns=0, metrics={"success": 0.0})


def test_a_warm_start_whose_every_demonstration_failed_says_how_they_ended() -> None:
    demos = [_demo(i, "lookup", Status.CONTEXT_LIMIT, 384) for i in range(6)] + \
            [_demo(6, "kg", Status.TURN_LIMIT, 900), _demo(7, "kg", Status.CONTEXT_LIMIT, 1024)]
    with pytest.raises(RuntimeError) as e:
        WarmStart(torch.nn.Linear(2, 2), demos, TrainerConfig(warm_start_steps=5), 0, 0)
    msg = str(e.value)
    assert msg.startswith("warm start: none of the 8 expert demonstrations succeeded (0 successful). How they ended: "
                          "kg: 1 context_limit, 1 turn_limit (longest 1024 tokens); lookup: 6 context_limit (longest "
                          "384 tokens)."), msg
    assert "context_limit: the conversations outgrew rollout.max_model_len" in msg
    assert "turn_limit: the expert's calls did not come back through the model's format" in msg
    with pytest.raises(RuntimeError, match="the expert wrote no demonstrations"):
        WarmStart(torch.nn.Linear(2, 2), [], TrainerConfig(warm_start_steps=5), 0, 0)


@pytest.fixture(scope="module")
def smol(tmp_path_factory) -> Path:
    return standins.build("smollm2", tmp_path_factory.mktemp("smol") / "model")


def test_published_and_exported_directories_carry_the_runs_template(smol, tmp_path) -> None:
    """A run with model.chat_template publishes weights whose tokenizer renders that template (transformers reads
    it from chat_template.jinja, and no stale copy is left in tokenizer_config.json); jobs.export copies it, and a
    version rebuilt from a checkpoint (`base_model`) gets it from the run's config."""
    from transformers import AutoTokenizer

    run = tmp_path / "run"
    run.mkdir()
    dump_config(load_config("smoke", [f"model.path={smol}", "model.chat_template=chatml-tools"]), run / "config.yaml")
    ours = chat_template_text("chatml-tools")
    model = load_model(smol, 1)
    v = weights_io.publish(run, 1, model.state_dict(), base=smol, chat_template=ours)
    assert AutoTokenizer.from_pretrained(str(v)).chat_template == ours
    assert "chat_template" not in json.loads((v / "tokenizer_config.json").read_text())
    assert AutoTokenizer.from_pretrained(str(smol)).chat_template != ours  # the base is left as it was
    out, version, source = export.export(run, tmp_path / "exported")
    assert (version, source) == (1, "weights") and AutoTokenizer.from_pretrained(str(out)).chat_template == ours
    base, template = export.base_model(run)
    assert base == smol and template == ours


def test_own_tools_is_resolved_against_the_base_and_published_once(smol, tmp_path) -> None:
    """model.chat_template=own-tools: the run's template is the base directory's own, given tools; a published
    version carries it, and reading it back from there does not wrap it again."""
    from transformers import AutoTokenizer

    run = tmp_path / "run"
    run.mkdir()
    dump_config(load_config("smoke", [f"model.path={smol}", "model.chat_template=own-tools"]), run / "config.yaml")
    base, template = export.base_model(run)
    assert base == smol and template == chat_template_text("own-tools", smol)
    assert template.endswith(AutoTokenizer.from_pretrained(str(smol)).chat_template)
    v = weights_io.publish(run, 1, load_model(smol, 1).state_dict(), base=smol, chat_template=template)
    assert AutoTokenizer.from_pretrained(str(v)).chat_template == template == chat_template_text("own-tools", v)


def test_freeze_layers_leaves_the_embedding_and_the_lower_layers_out_of_the_backward_pass(smol) -> None:
    model = load_model(smol, 1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    freeze_lower(model, 1)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert "model.embed_tokens.weight" not in trainable and not any(".layers.0." in n for n in trainable)
    assert any(".layers.1." in n for n in trainable) and "model.norm.weight" in trainable
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.tensor([[1, 2, 3, 4]]), labels=torch.tensor([[1, 2, 3, 4]])).loss.backward()
    opt.step()
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and moved <= trainable
    with pytest.raises(ValueError, match="trainer.freeze_layers: 2 must be below the model's decoder layers \\(2\\)"):
        freeze_lower(load_model(smol, 1), 2)
    # negative: the top -n layers train, whatever the depth (the embedding stays frozen)
    for n, frozen in ((-1, {0}), (-2, set()), (-5, set())):
        model = load_model(smol, 1)
        freeze_lower(model, n)
        trainable = {name for name, p in model.named_parameters() if p.requires_grad}
        assert {i for i in (0, 1) if not any(f".layers.{i}." in name for name in trainable)} == frozen, n
        assert "model.embed_tokens.weight" not in trainable and "model.norm.weight" in trainable
