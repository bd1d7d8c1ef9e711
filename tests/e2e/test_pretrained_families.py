"""A user's pretrained model, of three families, through the whole loop: `python -m jobs.train --preset smoke
model.path=DIR` on stand-in Qwen2.5-, Llama-3.1- and GLM-4-style directories (agentrl.models.standins:
their architectures in bf16, their special tokens, end-of-turn tokens and chat templates), with the
template check strict. Short runs (one RL step) on real processes and real vLLM."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from agentrl.models import standins
from agentrl.serving.session import Session
from agentrl.tasks import get_task
from agentrl.transport import weights
from agentrl.transport.shards import ShardReader

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e

SHORT = ["rollout.max_model_len=1024", "rollout.template_check=strict", "trainer.steps=1", "trainer.warm_start_steps=2",
         "trainer.warm_start_batch=8", "rollout.expert_samples=12", "rollout.eval_samples=4", "rollout.eval_sampled=0",
         "rollout.groups_per_task=2", "rollout.group_size=2", "rollout.max_new_tokens=24"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, Path, Path]]:
    """The three families' runs, started together (each waits on its processes' start-ups much of the time)."""
    started = {}
    for family in standins.FAMILIES:
        root = tmp_path_factory.mktemp(f"runs-{family}")
        model = standins.build(family, root / "model")
        log = (root / "train.log").open("w")
        proc = subprocess.Popen([sys.executable, "-m", "jobs.train", "--preset", "smoke", f"run_root={root}",
                                 f"name={family}", f"model.path={model}", *SHORT],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        started[family] = (proc, log, root, model)
    out = {}
    try:
        for family, (proc, log, root, model) in started.items():
            rc = proc.wait(timeout=900)
            log.close()
            text = (root / "train.log").read_text()
            assert rc == 0, text[-6000:]
            assert "summary: held-out success" in text
            out[family] = (family, model, root / family)
    finally:
        for proc, log, _, _ in started.values():
            if proc.poll() is None:  # one failed: its siblings stop too (jobs.train stops its roles on SIGTERM)
                proc.terminate()
                proc.wait(timeout=60)
            log.close()
    return out


@pytest.fixture(params=list(standins.FAMILIES))
def run(request, runs) -> tuple[str, Path, Path]:
    return runs[request.param]


def test_prompts_are_the_models_template_and_calls_reach_the_env(run) -> None:
    """The scripted expert's demonstrations go through the model's format both ways: each is rendered in
    the family's call syntax, read back by vLLM's parser for the family and answered by the env, which
    scores it. All of them win: every call reached the env with its arguments."""
    from transformers import AutoTokenizer

    family, model, run_dir = run
    tok = AutoTokenizer.from_pretrained(str(model))
    demos = ShardReader(run_dir / "shards" / "expert-0").wait(0, timeout_s=5)
    assert len(demos) == 12
    assert all(t.status.value == "completed" and t.reward == 1.0 for t in demos)
    assert all(t.num_turns == 2 and t.metrics["template_mismatch"] == 0 for t in demos)
    task = get_task("lookup")
    for t in demos[:3]:
        s = Session(task, t.index)
        want = tok.apply_chat_template(s.messages, tools=task.tools(), add_generation_prompt=True, tokenize=True)
        want = list(want["input_ids"] if hasattr(want, "keys") else want)
        assert t.tokens[: len(want)].tolist() == want  # token for token
        assert t.loss_mask[: len(want)].sum() == 0 and t.loss_mask[len(want)] == 1
        text = tok.decode(t.tokens.tolist())
        marker = {"qwen2.5": "<tool_response>", "llama3.1": "<|start_header_id|>ipython", "glm4": "<|observation|>"}
        assert marker[family] in text  # the tool result in the family's own role


def test_sampled_turns_end_on_the_models_stop_tokens_and_match_the_template(run) -> None:
    family, model, run_dir = run
    stops = {json.loads((model / "generation_config.json").read_text())["eos_token_id"][i]
             for i in range(len(standins.FAMILIES[family].stops))}
    written = [t for _, ts in ShardReader(run_dir / "shards" / "rollout-0").scan() for t in ts]  # segments
    trajs = [t for t in written if t.oldest_version() == 0]  # the first step's group (the synchronous schedule)
    assert len(trajs) == 4
    for t in trajs:
        assert t.metrics["template_mismatch"] == 0
        mask = np.append(t.loss_mask.astype(bool), False)
        starts = np.flatnonzero(mask[1:] & ~mask[:-1]) + 1
        if mask[0]:
            starts = np.append(0, starts)
        for a in starts:
            b = a + int(np.argmin(mask[a:]))  # the first context token after the run
            turn = t.tokens[a:b].tolist()
            # a sampled turn ends on one of the model's stop tokens, or at the turn's token budget
            assert turn[-1] in stops or len(turn) == 24 or b == len(t.tokens), (family, turn)
            assert all(i not in stops for i in turn[:-1])  # and never runs past one
    assert (run_dir / "report" / "summary.json").exists()


def test_published_weights_are_a_bf16_model_directory(run) -> None:
    family, model, run_dir = run
    v = weights.version_dir(run_dir, 1)
    assert json.loads((v / "config.json").read_text())["architectures"] == json.loads(
        (model / "config.json").read_text())["architectures"]
    assert (v / "generation_config.json").read_text() == (model / "generation_config.json").read_text()
    assert {t.dtype for t in load_file(str(v / weights.WEIGHTS_FILE)).values()} == {torch.bfloat16}
