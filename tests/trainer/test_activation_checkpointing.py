"""`trainer.activation_checkpointing`: the decoder layers keep only their inputs for the backward pass and
recompute the rest, for every stand-in family (and our tiny model), with the same gradients."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentrl.models import standins
from agentrl.trainer.logprobs import token_logprobs
from agentrl.trainer.model_load import load_policy
from agentrl.trainer.parallel import Parallel


def _saved_and_grads(model_dir: Path, recompute: bool) -> tuple[int, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = load_policy(model_dir, 1, Parallel(), activation_checkpointing=recompute)
    model.train()
    tokens = torch.randint(5, 200, (2, 24))
    saved = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += t.numel()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp, _ = token_logprobs(model, tokens, None, position_ids=torch.arange(24).expand(2, 24))
    (-logp.mean()).backward()
    return saved, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", sorted(standins.FAMILIES))
def test_recomputed_activations_give_the_same_gradients_for_less_saved(tmp_path: Path, family: str) -> None:
    model_dir = standins.build(family, tmp_path / family, num_layers=3)
    plain_saved, plain = _saved_and_grads(model_dir, False)
    ckpt_saved, ckpt = _saved_and_grads(model_dir, True)
    assert ckpt_saved < 0.7 * plain_saved, (ckpt_saved, plain_saved)  # the layers' insides are not kept
    assert plain.keys() == ckpt.keys() and len(plain) > 0
    for name, g in plain.items():
        torch.testing.assert_close(ckpt[name], g, rtol=1e-5, atol=1e-6, msg=name)
