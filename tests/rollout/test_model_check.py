"""`jobs.check_model` takes a run's model settings and says what it saw; a first prompt that cannot fit
rollout.max_model_len with a turn is an error naming both numbers, before any process starts (`preflight`,
which `jobs.train` runs for a pretrained model.path) and at the rollout's start (`check_prompts_fit`)."""
from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.models import standins
from agentrl.rollout.chat import ChatFormat
from agentrl.rollout.model_check import check_prompts_fit, first_prompts, preflight, prompts_too_long
from agentrl.serving.inprocess import InProcessClient
from agentrl.tasks import get_task

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def smol(tmp_path_factory) -> Path:
    return standins.build("smollm2", tmp_path_factory.mktemp("smol") / "model")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jobs.check_model", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_check_model_refuses_a_toolless_template_then_passes_with_the_override(smol) -> None:
    bad = _run(str(smol), "--tasks", "lookup")
    assert bad.returncode == 2 and "Set model.chat_template=chatml-tools" in bad.stderr, bad.stderr[-2000:]
    good = _run(str(smol), "--tasks", "lookup,unlock", "model.chat_template=chatml-tools",
                "rollout.max_model_len=1024", "rollout.max_new_tokens=64")
    assert good.returncode == 0, good.stdout + good.stderr[-2000:]
    out = good.stdout
    assert "template   model.chat_template=chatml-tools" in out and "parser     hermes" in out
    assert "reads back the chat template's own call (model_type 'llama'" in out
    assert "every first prompt and a turn fit" in out and "all tasks passed" in out


def test_check_model_counts_a_prompt_that_does_not_fit_when_the_length_is_set(smol) -> None:
    r = _run(str(smol), "--tasks", "lookup", "--chat-template", "chatml-tools", "rollout.max_model_len=200",
             "rollout.max_new_tokens=32")
    assert r.returncode == 1 and "rollout.max_model_len 200, max_new_tokens 32: too short for lookup (prompt" in r.stdout


def test_prompts_too_long_names_both_numbers_and_what_to_set() -> None:
    lengths = {"lookup": [290, 300], "kg": [1000, 1100]}
    assert prompts_too_long(lengths, 2048, 96) is None
    msg = prompts_too_long(lengths, 1024, 96)
    assert msg == ("rollout.max_model_len: 1024 tokens cannot hold the first prompt and one turn (rollout.max_new_tokens "
                   "96) of kg (prompt 1100 tokens); set rollout.max_model_len >= 1196 (python -m jobs.check_model "
                   "prints each task's prompt in this model's chat format)")
    assert prompts_too_long({"kg": [900, 1100]}, 1024, 96, every=True) is None  # an evaluation can score some
    assert prompts_too_long({"kg": [1000, 1100]}, 1024, 96, every=True) is not None


def test_the_rollouts_check_and_preflight_refuse_a_length_the_prompts_cannot_fit(smol) -> None:
    fmt = ChatFormat.load(smol, chat_template="chatml-tools")
    client = InProcessClient({"lookup": get_task("lookup")})
    lengths = asyncio.run(first_prompts(client, fmt, ["lookup"], samples=4))
    assert len(lengths["lookup"]) == 4 and all(250 < n < 700 for n in lengths["lookup"])
    with pytest.raises(ValueError, match=r"rollout.max_model_len: 384 tokens cannot hold .* \(rollout.max_new_tokens 32\) of lookup"):
        asyncio.run(check_prompts_fit(client, fmt, ["lookup"], 384, 32))
    assert asyncio.run(check_prompts_fit(client, fmt, ["lookup"], 1024, 32))["lookup"]
    # the smoke preset's 384 tokens, as a user would first try a model of their own: refused before any process
    cfg = load_config("smoke", [f"model.path={smol}", "model.chat_template=chatml-tools"])
    with pytest.raises(ValueError, match="rollout.max_model_len: 384 tokens cannot hold"):
        preflight(cfg)
    assert preflight(load_config("smoke", [f"model.path={smol}", "model.chat_template=chatml-tools",
                                           "rollout.max_model_len=1024"])).parser.name == "hermes"


def test_a_sample_that_does_not_start_is_left_out_of_the_prompt_lengths(smol) -> None:
    """AgentBench's db dev-5 (a column named '') does not start on MariaDB: the evaluation's check of the first
    prompts measures the others instead of ending the evaluation before it began."""
    from agentrl.tasks.api import EnvError

    class OneBroken(InProcessClient):
        async def start_sample(self, task: str, index: str):
            if str(index) == self.broken:
                raise EnvError("env_error", f"task {task} failed to start {index!r}: ProgrammingError")
            return await super().start_sample(task, index)

    fmt = ChatFormat.load(smol, chat_template="chatml-tools")
    client = OneBroken({"lookup": get_task("lookup")})
    client.broken = str(asyncio.run(client.indices("lookup", "train"))[1])
    lengths = asyncio.run(first_prompts(client, fmt, ["lookup"], samples=4))
    assert len(lengths["lookup"]) == 3
