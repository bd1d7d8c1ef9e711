"""When has the warm start taught enough? A check on held-out demonstrations, independent of step counts.

A tiny model trained from scratch learns each copy skill (a name from the question into a call, a value
from a tool result into the answer) in a sudden transition whose step moves from machine to machine. A
warm start stopped after a fixed number of steps lands before the transition on some machines and after
it on others. Instead, the warm start runs until the policy *can* reproduce the expert's successful
episodes: each held-out successful demonstration counts as reproduced when every one of its action tokens
has probability at least `min_prob` under the policy (teacher forced). The bar is on probability, not on
the argmax, so that an expert who mixes good and bad moves (the demo's imperfect expert: the right field
half the time) is still imitated: the right move at probability 0.5 counts, a value the model cannot yet
copy (probability ~1/90) does not.
"""
from __future__ import annotations

from collections import defaultdict

import torch

from agentrl.trainer.batch import collate
from agentrl.trainer.logprobs import token_logprobs
from agentrl.types import Trajectory


@torch.no_grad()
def reproduced_share(model: torch.nn.Module, demos: list[Trajectory], pad_id: int, min_prob: float,
                     chunk: int = 64) -> dict[str, float]:
    """Per task, the share of `demos` whose every action token has probability >= `min_prob`.

    A collective under FSDP2 (every rank must call it with the same demos): it runs the model forward.
    """
    was_training = model.training
    model.eval()
    hits: dict[str, list[bool]] = defaultdict(list)
    floor = torch.log(torch.tensor(min_prob))
    for start in range(0, len(demos), chunk):
        part = demos[start:start + chunk]
        batch = collate(part, [0.0] * len(part), pad_id)
        logp, _ = token_logprobs(model, batch.tokens, batch.attention)  # [B, T-1]
        ok = ((logp >= floor) | (batch.mask == 0)).all(dim=-1)  # [B]
        for t, good in zip(part, ok.tolist()):
            hits[t.task].append(bool(good))
    if was_training:
        model.train()
    return {task: sum(v) / len(v) for task, v in sorted(hits.items())}
