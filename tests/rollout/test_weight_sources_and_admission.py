"""Small pieces of the asynchronous rollout rank: its share of a step's groups, and where it finds weights."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentrl.rollout.agent_loop import EpisodeLimits
from agentrl.rollout.collect import Retry
from agentrl.rollout.role import RankPlace
from agentrl.rollout.spec import RolloutSpec
from agentrl.rollout.weight_sources import DirWeights
from agentrl.transport import weights


def _spec(prompts: int, tasks: tuple[str, ...]) -> RolloutSpec:
    return RolloutSpec(tasks=tasks, steps=3, prompts_per_step=prompts, samples_per_prompt=4, expert_samples=0,
                eval_split="test", eval_samples=1, concurrency=8, temperature=1.0, top_p=1.0,
                limits=EpisodeLimits(0, 64, 8), retry=Retry(), wait_timeout_s=60.0, seed=0, poll_s=0.05,
                eval_sampled=0, train=True)


@pytest.mark.parametrize(("prompts", "tasks", "ranks", "shares"), [
    (8, ("a", "b"), 1, [16]), (8, ("a", "b"), 3, [6, 5, 5]), (1, ("a",), 2, [1, 0]), (2, ("a",), 2, [1, 1])])
def test_ranks_split_one_step_of_groups(prompts: int, tasks: tuple[str, ...], ranks: int, shares: list[int]) -> None:
    spec = _spec(prompts, tasks)
    got = [RankPlace(r, ranks, max_staleness=1).groups_per_step(spec) for r in range(ranks)]
    assert got == shares and sum(got) == prompts * len(tasks)


def test_dir_weights_take_the_newest_complete_version(tmp_path: Path) -> None:
    src = DirWeights(tmp_path, poll_s=0.01)
    assert src.newest(-1) is None
    for v in range(5):  # keep_last=3: v0 and v1 are pruned
        weights.publish(tmp_path, v, {"w": torch.full((2,), float(v))})
    version, load = src.newest(2)  # a notice of v2, while v4 is already complete: take v4
    assert version == 4 and float(dict(load())["w"][0]) == 4.0
    assert src.wait(3, timeout_s=1.0)[0] == 4
    with pytest.raises(TimeoutError, match="v7"):
        src.wait(7, timeout_s=0.05)
