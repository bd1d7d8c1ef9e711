"""The warm start's stopping check: a demonstration is reproducible when every action token is likely enough."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from agentrl.trainer.imitation import reproduced_share
from agentrl.types import Status, Trajectory

V = 8


class OneHot(torch.nn.Module):
    """A 'decoder' whose last hidden state is the current token, one-hot."""

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        return SimpleNamespace(last_hidden_state=torch.nn.functional.one_hot(input_ids, V).float())


class FixedPolicy(torch.nn.Module):
    """Next-token distribution that puts probability `p` on token (t+1) % V after token t, the rest spread evenly:
    shaped like a Hugging Face causal LM (a decoder, a linear head) so that the trainer's head runs on it."""

    base_model_prefix = "model"

    def __init__(self, p: float) -> None:
        super().__init__()
        self.config = SimpleNamespace()
        self.model = OneHot()
        self.lm_head = torch.nn.Linear(V, V, bias=False)
        probs = torch.full((V, V), (1 - p) / (V - 1))  # [next, current]
        probs[(torch.arange(V) + 1) % V, torch.arange(V)] = p
        with torch.no_grad():
            self.lm_head.weight.copy_(probs.log())

    def get_output_embeddings(self) -> torch.nn.Linear:
        return self.lm_head


def demo(task: str, tokens: list[int], mask: list[int]) -> Trajectory:
    n = len(tokens)
    return Trajectory("id", task, "i", "g", tokens, mask, [0.0] * n, [-1] * n, [-1] * n, 1.0, Status.COMPLETED, 1)


def test_share_counts_demos_whose_every_action_token_clears_the_bar() -> None:
    follows = demo("a", [1, 2, 3, 4], [0, 1, 1, 1])  # every action token is the likely successor
    breaks = demo("a", [1, 2, 5, 6], [0, 1, 1, 1])  # token 5 after 2 is unlikely (an uncopied value)
    masked = demo("b", [1, 2, 5, 6], [0, 1, 0, 1])  # the unlikely token is context, not an action: ignored
    share = reproduced_share(FixedPolicy(0.5), [follows, breaks, masked], pad_id=0, min_prob=0.2)
    assert share == {"a": 0.5, "b": 1.0}


def test_the_bar_is_a_probability_not_the_argmax() -> None:
    # an imperfect expert's right move at probability 0.3 (not certain) still counts at a bar of 0.2 ...
    d = demo("a", [1, 2, 3], [0, 1, 1])
    assert reproduced_share(FixedPolicy(0.3), [d], pad_id=0, min_prob=0.2) == {"a": 1.0}
    # ... and not at a bar above it
    assert reproduced_share(FixedPolicy(0.3), [d], pad_id=0, min_prob=0.4) == {"a": 0.0}
