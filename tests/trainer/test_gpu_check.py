"""The GPU check's CPU path (`python -m jobs.gpu_check --cpu --tiny`): a tiny Qwen2 trained by the real RL step
under FSDP2 on a one-rank gloo group, its steps interleaved with the bare step's, in seconds; its arithmetic (the
FLOPs a step must do, the peak table, shapes). The GPU path itself needs a GPU machine (docs/trainer.md)."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.trainer.gpu_check import (
    TINY,
    TINY_CHECK,
    bf16_peak,
    shape_of,
    synthetic_trajectories,
    train_flops,
)
from agentrl.trainer.memory import SHAPES, Shape


def test_train_flops_by_hand() -> None:
    s = Shape(hidden=4, layers=2, heads=2, kv_heads=1, intermediate=8, vocab=10, tied=True)
    decoder = 2 * (s.layer_params() - 2 * 4)  # the matmul weights and biases of both layers
    # 6 per token and weight; causal attention 6 L q S² (q = 2 heads x 2); the head 6 V D per head position
    assert train_flops(s, [3], head_rows=2) == 6 * decoder * 3 + 6 * 2 * 4 * 9 + 6 * 10 * 4 * 2
    assert train_flops(s, [3, 1], 0) == 6 * decoder * 4 + 6 * 2 * 4 * (9 + 1)


@pytest.mark.parametrize("name, tflops", [
    ("NVIDIA H200", 989), ("NVIDIA H100 80GB HBM3", 989), ("NVIDIA H100 PCIe", 756), ("NVIDIA A100-SXM4-80GB", 312),
    ("NVIDIA GH200 480GB", 989), ("Tesla T4", None),
])
def test_bf16_peaks_by_device_name(name: str, tflops: int | None) -> None:
    peak = bf16_peak(name)
    assert (peak / 1e12 if peak else None) == tflops


def test_shapes_by_name_or_config(tmp_path: Path) -> None:
    assert shape_of("3b") == SHAPES["3b"] and shape_of("tiny") == TINY
    cfg = {"hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
           "intermediate_size": 96, "vocab_size": 300, "tie_word_embeddings": False, "model_type": "qwen2"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert shape_of(str(tmp_path / "config.json")) == Shape(64, 3, 4, 2, 96, 300, tied=False)
    with pytest.raises(ValueError, match="one of"):
        shape_of("70b")


def test_tiny_check_trains_on_cpu_with_fsdp2_and_writes_one_json(tmp_path: Path) -> None:
    """`python -m jobs.gpu_check --cpu --tiny`: FSDP2 on a one-rank gloo group, ours and the bare step interleaved,
    the report on stdout and in one JSON file."""
    out = tmp_path / "check.json"
    run = subprocess.run([sys.executable, "-m", "jobs.gpu_check", "--cpu", "--tiny", "--out", str(out)],
                         capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == 0, run.stderr[-2000:]
    r = json.loads(out.read_text())
    assert r["shape"] == "tiny" and r["check"]["micro_batch_tokens"] == TINY_CHECK.micro_batch_tokens
    assert r["finite"] and r["loss"] != 0 and r["grad_norm"] > 0
    assert r["backend"] == "gloo" and r["nccl"] == "not used" and r["attention"] == "sdpa"
    assert r["tokens_per_s"] > 0 and r["micro_batches"] >= 2 and r["ours_over_bare"] > 0
    assert [len(x) for x in r["step_s"]] == [TINY_CHECK.steps] * TINY_CHECK.repeats == [len(x) for x in
                                                                                        r["bare"]["step_s"]]
    assert r["mfu"] is None and r["params"] == TINY.params()
    lengths = [t.num_tokens for t in synthetic_trajectories(8, 4, 24, 96, TINY.vocab, 0)]
    assert r["tokens_per_step"] == sum(lengths) > r["head_positions_per_step"] > 0
    assert math.isclose(r["model_tflops_per_step"] * 1e12, train_flops(TINY, lengths, r["head_positions_per_step"]))
    m = r["memory"]
    assert set(m["modelled_gib"]) == set(m["measured_gib"]) == {"params", "params_grads_optimizer", "step_peak"}
    assert m["measured_gib"]["params"] == pytest.approx(m["modelled_gib"]["params"], rel=0.05)
    assert m["measured_gib"]["params_grads_optimizer"] == pytest.approx(m["modelled_gib"]["params_grads_optimizer"],
                                                                        rel=0.05)
    agree = r["logprob_agreement"]  # bf16 weights and compute: agreement within bf16's rounding of the logits
    assert agree["positions"] > 0 and agree["max_abs"] < 0.1 and agree["mean_abs"] < 0.02
    assert "MFU unknown (no bf16 peak known for 'cpu')" in run.stdout and "nccl: not used (gloo)" in run.stdout
    assert "ours/bare" in run.stdout and "modelled | measured" in run.stdout and f"report: {out}" in run.stdout
