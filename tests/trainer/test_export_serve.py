"""Weights a user can serve: every published version is a complete model directory in the model's dtype,
`jobs.export` writes one from the weights or from a checkpoint, and transformers, vLLM and vLLM's OpenAI
server (with the model's tool parser) load what it wrote.

The model is a Qwen2.5-style stand-in (bf16) taught one tool call by a few hundred supervised steps, so that
its greedy answer to the prompt is that call: the server must hand it back parsed."""
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

from agentrl.config import dump_config, load_config
from agentrl.models import standins
from agentrl.rollout.chat import ChatFormat
from agentrl.trainer import checkpoint
from agentrl.trainer.export import export
from agentrl.trainer.model_load import load_model
from agentrl.trainer.parallel import Parallel
from agentrl.transport import weights as weights_io

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Find an item.", "parameters": {
    "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}}]
MESSAGES = [{"role": "user", "content": "What is the code of bako?"}]
CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "c", "type": "function", "function": {"name": "lookup", "arguments": '{"name": "bako"}'}}]}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path, torch.nn.Module, list[int], list[int]]:
    """(base dir, run dir, the taught model, prompt ids, the call's ids)."""
    root = tmp_path_factory.mktemp("serve")
    base = standins.build("qwen2.5", root / "base")
    fmt = ChatFormat.load(base)
    prompt, target = fmt.prompt_ids(MESSAGES, TOOLS), fmt.assistant_ids(CALL, TOOLS)
    model = load_model(base, 2)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    ids = torch.tensor([prompt + target])
    labels = ids.clone()
    labels[0, : len(prompt)] = -100
    for _ in range(150):
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05
    run = root / "run"
    run.mkdir()
    dump_config(load_config("smoke", [f"model.path={base}"]), run / "config.yaml")
    return base, run, model, prompt, target


def test_published_versions_are_complete_model_directories_in_the_models_dtype(trained) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base, run, model, prompt, target = trained
    v = weights_io.publish(run, 1, model.state_dict(), base=base)
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors",
            "meta.json"} <= {p.name for p in v.iterdir()}
    tensors = load_file(str(v / weights_io.WEIGHTS_FILE))
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}  # config.json says bf16; the trainer held fp32
    loaded = AutoModelForCausalLM.from_pretrained(str(v))
    assert loaded.dtype == torch.bfloat16
    assert AutoTokenizer.from_pretrained(str(v)).chat_template == AutoTokenizer.from_pretrained(str(base)).chat_template
    out = loaded.float().generate(torch.tensor([prompt]), max_new_tokens=len(target) + 2, do_sample=False)
    assert out[0, len(prompt):].tolist()[: len(target)] == target  # greedy, it writes the call it was taught


def test_export_from_weights_and_from_a_checkpoint(trained, tmp_path: Path) -> None:
    base, run, model, _, _ = trained
    weights_io.publish(run, 1, model.state_dict(), base=base)
    cli = subprocess.run([sys.executable, "-m", "jobs.export", str(run), str(tmp_path / "v1"), "--version", "1"],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and "exported v1" in cli.stdout and "from its weights" in cli.stdout, cli.stderr
    assert (tmp_path / "v1" / "config.json").exists()

    # version 3 exists only as a checkpoint (its weights were pruned): rebuilt from the DCP shards
    opt = torch.optim.AdamW(model.parameters(), lr=0.0)
    checkpoint.save(run, checkpoint.TrainerState(step=3, policy_version=3), model, opt, None, Parallel())
    assert export(run, tmp_path / "v3") == (tmp_path / "v3", 3, "checkpoint")  # the newest: 3
    got = load_file(str(tmp_path / "v3" / weights_io.WEIGHTS_FILE))
    want = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert json.loads((tmp_path / "v3" / "meta.json").read_text())["version"] == 3

    with pytest.raises(FileNotFoundError, match="version 9 is neither published"):
        export(run, tmp_path / "v9", 9)
    with pytest.raises(FileExistsError):  # never over an existing directory
        export(run, tmp_path / "v3")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_vllm_serves_the_export_and_parses_its_tool_call(trained, tmp_path: Path) -> None:
    """vllm.LLM loads the directory as it is; its OpenAI server with `--tool-call-parser hermes` (what
    `model.tool_parser: auto` picks for Qwen2) answers a chat request with tools with a parsed call."""
    base, run, model, prompt, target = trained
    weights_io.publish(run, 1, model.state_dict(), base=base)
    out = tmp_path / "served"
    export(run, out, 1)
    port = _free_port()
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(out), "--host", "127.0.0.1",
         "--port", str(port), "--dtype", "float32", "--max-model-len", "1024", "--enforce-eager",
         "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--served-model-name", "policy"],
        stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        import openai

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=30)
        deadline = time.monotonic() + 240
        while True:
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("the server did not start:\n" + (tmp_path / "server.log").read_text()[-3000:]) from None
                time.sleep(1)
        reply = client.chat.completions.create(model="policy", messages=MESSAGES, tools=TOOLS, temperature=0,
                                               max_tokens=len(target) + 4)
        (call,) = reply.choices[0].message.tool_calls
        assert call.function.name == "lookup" and json.loads(call.function.arguments) == {"name": "bako"}
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
