"""The rollout rank's held-out evaluation and warm-start collection, with the scripted expert playing.

The in-run evaluation's numbers: success over every episode, env errors (after the retries) counted as
failures and reported beside it, as `jobs.eval` scores them (one index always fails in the env). The
expert's demonstrations: a progress line, the shard written."""
from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest

from agentrl.config import RolloutConfig, RunConfig
from agentrl.rollout.collect import Retry
from agentrl.rollout.engine import ExpertEngine
from agentrl.rollout.in_run_eval import evaluate
from agentrl.rollout.spec import RolloutSpec
from agentrl.serving.inprocess import InProcessClient
from agentrl.tasks import get_task
from agentrl.tasks.api import EnvError


class Broken(InProcessClient):
    """test-3 never starts (an env error on every attempt); the rest play as usual."""

    def __init__(self) -> None:
        super().__init__({"lookup": get_task("lookup")})
        self.starts: dict[str, int] = {}

    async def start_sample(self, task, index):
        self.starts[index] = self.starts.get(index, 0) + 1
        if index == "test-3":
            raise EnvError("env_error", "worker went away")
        return await super().start_sample(task, index)


class Recorder:
    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def scalars(self, values, step) -> None:
        self.values.update(values)

    def text(self, tag, value, step=0) -> None:
        pass


def test_env_errors_stay_in_the_denominator(lookup_format, tmp_path: Path) -> None:
    client = Broken()
    spec = RolloutSpec.from_config(RunConfig(rollout=RolloutConfig(eval_samples=4, concurrency=2, max_turns=4)))
    spec = dataclasses.replace(spec, retry=Retry(max_retries=1, backoff_s=0.001))  # a short pause before the retry
    mon = Recorder()
    m, per_task = asyncio.run(evaluate(client, ExpertEngine(client), lookup_format, spec, 5, tmp_path, mon))
    assert client.starts["test-3"] == 2  # tried, retried once, then reported
    assert m["eval/episodes"] == 4 and m["eval/env_errors"] == 1 and m["eval/env_error_rate"] == 0.25
    assert m["eval/success"] == pytest.approx(3 / 4)  # the expert solves the other three
    assert per_task["lookup"]["success"] == pytest.approx(3 / 4) and per_task["lookup"]["env_errors"] == 1
    assert per_task["lookup"]["status"] == {"completed": 3, "env_error": 1}
    assert mon.values["eval/success"] == m["eval/success"]
    written = json.loads((tmp_path / "eval-v5.json").read_text())
    assert written["eval/success"] == pytest.approx(0.75) and written["per_task"]["lookup"]["episodes"] == 4


def test_expert_demonstrations_show_progress(lookup_format, tmp_path: Path, capsys) -> None:
    from agentrl.rollout.role import expert_demos
    from agentrl.transport.shards import ShardReader

    client = InProcessClient({"lookup": get_task("lookup")})
    spec = RolloutSpec.from_config(RunConfig(rollout=RolloutConfig(expert_samples=3, concurrency=2, max_turns=4)))
    asyncio.run(expert_demos(tmp_path, client, lookup_format, spec, Recorder()))
    out = capsys.readouterr().out.splitlines()  # not a terminal: plain lines, the last at the end
    assert out[-1].startswith("expert demonstrations: 3/3 (100%) | last lookup |")
    assert ShardReader(tmp_path / "shards" / "expert-0").available()
