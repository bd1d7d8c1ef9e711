"""The whole loop end to end: `python -m jobs.train --preset smoke` (the synchronous schedule: the pipeline
with max_staleness 0 and one step's groups per step) with real processes, real sockets, an MPI world, real
vLLM (CPU build), real HDF5 shards and TensorBoard files. About a minute on 2 cores."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from agentrl.transport import weights
from agentrl.transport.shards import ShardReader

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    proc = subprocess.run([sys.executable, "-m", "jobs.train", "--preset", "smoke", f"run_root={root}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "summary: held-out success" in proc.stdout
    return root / "smoke"


def test_run_dir_layout_and_summary(run_dir: Path) -> None:
    for p in ("config.yaml", "rendezvous.json", "model/config.json", "model/tokenizer.json", "logs/pipeline.log",
              "logs/controller.log", "report/ledger.json", "report/eval-v0.json", "report/eval-v2.json",
              "report/eval_sampled-v0.json", "report/eval_sampled-v2.json"):
        assert (run_dir / p).exists(), p
    summary = json.loads((run_dir / "report" / "summary.json").read_text())
    assert summary["rl_steps"] == 2 and summary["eval_episodes"] == 8  # both steps changed the weights
    trainer = json.loads((run_dir / "report" / "trainer.json").read_text())
    assert trainer["rl_steps"] == 2 and trainer["steps_done"] == 2 and trainer["sft_steps"] == 5
    for version, key in ((0, "success_before_rl"), (2, "success_after_rl")):
        ev = json.loads((run_dir / "report" / f"eval-v{version}.json").read_text())
        assert summary[key] == ev["eval/success"] == ev["per_task"]["lookup"]["success"]
    row = summary["per_task"]["lookup"]
    assert row["episodes"] == 8 and sum(row["status"]["after_rl"].values()) == 8
    assert sum(row["status"]["sampled_after_rl"].values()) == 16
    assert row["sampled_gain"] == row["sampled_success_after_rl"] - row["sampled_success_before_rl"]
    assert summary["sampled_eval_episodes"] == 16  # 8 held-out samples, 2 draws each at the rollout temperature
    sampled = json.loads((run_dir / "report" / "eval_sampled-v2.json").read_text())
    assert sampled["eval_sampled/success"] == summary["sampled_success_after_rl"]
    assert sampled["eval_sampled/episodes"] == 16


def test_trajectories_were_produced_with_per_token_provenance(run_dir: Path) -> None:
    expert = ShardReader(run_dir / "shards" / "expert-0").read(0)
    assert len(expert) == 64 and all(t.reward == 1.0 for t in expert)
    written = _rollout_trajectories(run_dir)
    assert len(written) == 2 * 2 * 4  # steps x groups_per_task x group_size: nothing sampled ahead
    for step in range(2):
        trajs = [t for t in written if t.oldest_version() == step]
        assert len(trajs) == 2 * 4  # each step's groups, all sampled by weights v<step>
        assert len({t.group_id for t in trajs}) == 2
        for t in trajs:
            act = t.loss_mask == 1
            assert act.any() and (~act).any()
            assert set(t.policy_version[act].tolist()) == {step}  # sampled by weights v<step>
            assert set(t.engine[act].tolist()) == {0} and set(t.policy_version[~act].tolist()) == {-1}
            assert np.all(t.logprobs[act] <= 0.0)
    ledger = json.loads((run_dir / "report" / "ledger.json").read_text())
    assert sorted(ledger["consumed"]) == sorted(t.traj_id for t in written) and not ledger["held_at_end"]


def _rollout_trajectories(run_dir: Path) -> list:
    return [t for _, ts in ShardReader(run_dir / "shards" / "rollout-0").scan() for t in ts]


def test_trainer_trained_and_logged(run_dir: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ("train/loss", "train/grad_norm", "train/clipfrac", "train/approx_kl", "rollout/lookup/reward",
                "rollout/lookup/success", "eval/success", "sft/sft_loss", "pipeline/batch_size",
                "pipeline/rollout_tokens_per_s", "train/adv/lookup/mean"):
        assert tag in tags, tag
    assert [e.step for e in acc.Scalars("pipeline/batch_size")] == [0, 1]
    trained = [e.value for e in acc.Scalars("pipeline/batch_size")]
    dropped = [e.value for e in acc.Scalars("pipeline/dropped_uniform")]
    infra = [e.value for e in acc.Scalars("pipeline/dropped_infra")]
    assert [a + b + c for a, b, c in zip(trained, dropped, infra)] == [8, 8]  # every trajectory accounted for


def test_engine_sampled_with_the_new_weights_after_a_step(run_dir: Path) -> None:
    """Step 1's episodes were generated after the swap to v1: their behaviour log-probs are v1's, not v0's."""
    from transformers import AutoModelForCausalLM

    from agentrl.trainer.batch import collate
    from agentrl.trainer.logprobs import token_logprobs

    v0 = dict(weights.iter_weights(weights.version_dir(run_dir, 0)))
    v1 = dict(weights.iter_weights(weights.version_dir(run_dir, 1)))
    assert max(float((v0[k] - v1[k]).abs().max()) for k in v0) > 0  # the step changed the weights

    trajs = [t for t in _rollout_trajectories(run_dir) if t.oldest_version() == 1]
    batch = collate(trajs, [0.0] * len(trajs), pad_id=0)
    model = AutoModelForCausalLM.from_pretrained(str(run_dir / "model"), dtype=torch.float32)
    gaps = {}
    for name, sd in (("v0", v0), ("v1", v1)):
        model.load_state_dict(sd)
        with torch.no_grad():
            logp, _ = token_logprobs(model, batch.tokens, batch.attention)
        gaps[name] = float(((logp - batch.behaviour_logp).abs() * batch.mask).max())
    assert gaps["v1"] < 1e-3, gaps
    assert gaps["v0"] > 10 * gaps["v1"], gaps


def test_a_control_run_starts_from_the_runs_warm_start_instead_of_repeating_it(run_dir: Path) -> None:
    """`trainer.warm_start_from`: the seed's control continues the RL run's warm start (no warm start, no expert
    episodes, no evaluation before RL of its own) and reports the same numbers before RL."""
    proc = subprocess.run([sys.executable, "-m", "jobs.train", "--preset", "smoke", "--name", "smoke-control",
                           f"run_root={run_dir.parent}", "trainer.update=warm_start", f"trainer.warm_start_from={run_dir}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert f"starting from the warm start of {run_dir}" in proc.stdout
    control = run_dir.parent / "smoke-control"
    log = (control / "logs" / "pipeline.log").read_text()
    assert "control run: continuing the warm start" in log and "warm start on" not in log
    assert "expert: demonstrations already written" in log and "before-RL evaluation of v0 read" in log
    mine, source = (json.loads((d / "report" / "summary.json").read_text()) for d in (control, run_dir))
    assert mine["success_before_rl"] == source["success_before_rl"]
    assert mine["sampled_success_before_rl"] == source["sampled_success_before_rl"]
    trainer = json.loads((control / "report" / "trainer.json").read_text())
    assert trainer["sft_steps"] == 5 and trainer["steps_done"] == 2
    # its steps imitate: the rollout played no training episode, so none waited in its steps or was dropped
    assert trainer.get("trajectories_trained", 0) == 0 and trainer.get("dropped_control", 0) == 0
    assert json.loads((control / "report" / "rollout-0.json").read_text())["trajectories"] == 0
    assert not list((control / "shards" / "rollout-0").glob("*.h5"))
