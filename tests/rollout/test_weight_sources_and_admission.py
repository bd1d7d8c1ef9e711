"""Small pieces of the asynchronous rollout rank: its share of a step's groups, and where it finds weights."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentrl.config import EnvsConfig, RolloutConfig, RunConfig
from agentrl.rollout.role import RankPlace
from agentrl.rollout.spec import RolloutSpec
from agentrl.rollout.weight_sources import DirWeights
from agentrl.transport import weights


def _spec(prompts: int, tasks: tuple[str, ...]) -> RolloutSpec:
    cfg = RunConfig(envs=EnvsConfig(tasks=tasks), rollout=RolloutConfig(groups_per_task=prompts))
    return RolloutSpec.from_config(cfg)


@pytest.mark.parametrize(("prompts", "tasks", "ranks", "shares"), [
    (8, ("lookup", "db"), 1, [16]), (8, ("lookup", "db"), 3, [6, 5, 5]), (1, ("lookup",), 2, [1, 0]),
    (2, ("lookup",), 2, [1, 1])])
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
