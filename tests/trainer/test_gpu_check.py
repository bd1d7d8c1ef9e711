"""The GPU check's CPU path (`python -m jobs.gpu_check --cpu --tiny`): a tiny Qwen2 trained by the real RL step
under FSDP2 on a one-rank gloo group, in seconds; and its arithmetic (FLOPs, the peak table). The GPU path
itself needs a GPU machine (docs/slurm.md, GPU check)."""
from __future__ import annotations

import math

import pytest
import torch

from agentrl.trainer.gpu_check import TINY_CHECK, bf16_peak, run_check, start_process_group, summary, train_flops
from agentrl.trainer.parallel import DistEnv, close_distributed


def test_train_flops_by_hand() -> None:
    # 6 N S for the matmuls + 6 L d S^2 for causal attention: 6*10*3 + 6*2*4*9 = 180 + 432
    assert train_flops(n_params=10, layers=2, hidden=4, lengths=[3]) == 612.0
    assert train_flops(10, 2, 4, [3, 1]) == 612.0 + 60 + 48


@pytest.mark.parametrize("name, tflops", [
    ("NVIDIA H200", 989), ("NVIDIA H100 80GB HBM3", 989), ("NVIDIA H100 PCIe", 756), ("NVIDIA A100-SXM4-80GB", 312),
    ("NVIDIA GH200 480GB", 989), ("Tesla T4", None),
])
def test_bf16_peaks_by_device_name(name: str, tflops: int | None) -> None:
    peak = bf16_peak(name)
    assert (peak / 1e12 if peak else None) == tflops


def test_tiny_check_trains_on_cpu_with_fsdp2() -> None:
    device = torch.device("cpu")
    start_process_group(DistEnv(), device)
    try:
        r = run_check(TINY_CHECK, DistEnv(), device)
    finally:
        close_distributed()
    assert r["finite"] and r["loss"] != 0 and r["grad_norm"] > 0
    assert r["backend"] == "gloo" and r["nccl"] == "not used"
    assert r["tokens_per_s"] > 0 and len(r["step_s"]) == TINY_CHECK.steps and r["micro_batches"] >= 2
    assert r["mfu"] is None and r["params"] == sum([512 * 64, 2 * (64 * 64 + 64 + 2 * (64 * 32 + 32) + 64 * 64
                                                                  + 3 * 64 * 128 + 2 * 64), 64])
    assert math.isclose(r["model_tflops_per_step"] * 1e12, train_flops(r["params"], 2, 64, _lengths()), rel_tol=1e-9)
    text = summary(r)
    assert "MFU unknown: no bf16 peak known for 'cpu'" in text and "nccl: not used (gloo)" in text


def _lengths() -> list[int]:
    from agentrl.trainer.gpu_check import synthetic_trajectories

    c = TINY_CHECK
    return [t.num_tokens for t in synthetic_trajectories(c.trajectories, c.group, c.min_len, c.max_len,
                                                          c.shape.vocab, c.seed)]
