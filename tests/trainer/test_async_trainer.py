"""The trainer role (`jobs.trainer`) under a real mpiexec world, fed by a scripted rollout rank: on the
synchronous schedule (the pipeline with max_staleness 0 and one step's groups per step), and on the
asynchronous one set to the same numbers, it makes exactly the update of plain `rl_step`s on each step's batch."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from scripted_batches import STEPS, by_hand, scripted_model, settings_of, step_batch

from agentrl.config import dump_config, load_config
from agentrl.launch.local import mpiexec
from agentrl.trainer.model_load import load_model
from agentrl.transport import weights
from agentrl.transport.shards import write_shard

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scripted_model(tmp_path_factory.mktemp("model"))


def _run_world(run_dir: Path, model_dir: Path, extra: list[str], broadcast: bool = False, trainer_ranks: int = 1,
               warm_start_steps: int = 0, steps: int = STEPS, first: int = 0, delay_s: float = 0.0
               ) -> subprocess.CompletedProcess:
    """The trainer's `trainer_ranks` ranks and one scripted rollout rank in one mpiexec world (`first` > 0: the
    same run dir again, the rollout rank sending steps first..steps-1)."""
    cfg = load_config(None, [f"model.path={model_dir}", f"trainer.steps={steps}", f"trainer.warm_start_steps={warm_start_steps}",
                             "trainer.checkpoint_every=1", "trainer.threads=1", "trainer.lr=0.003", "trainer.warm_start_lr=0.003",
                             "trainer.warmup_steps=2", "trainer.micro_batch_tokens=64", "monitor.tensorboard=false",
                             "cluster.role_timeout_s=120", "transport.poll_s=0.02",
                             "rollout.groups_per_task=2", "rollout.group_size=4", "trainer.warm_start_batch=4",
                             f"cluster.trainer.ranks_per_node={trainer_ranks}", *extra])
    run_dir.mkdir(parents=True, exist_ok=bool(first))
    dump_config(cfg, run_dir / "config.yaml")
    if warm_start_steps and not first:  # the expert's demonstrations
        (run_dir / "shards" / "expert-0").mkdir(parents=True)
        write_shard(run_dir / "shards" / "expert-0" / "000000.h5", step_batch(-1, 3))
    cmd = [mpiexec(), "-n", str(trainer_ranks), sys.executable, "-m", "mpi4py", "-m", "jobs.trainer",
           "--run-dir", str(run_dir), ":", "-n", "1", sys.executable, "-m", "mpi4py", str(HERE / "async_scripted_rollout.py"), str(run_dir),
           str(steps), *(["broadcast"] if broadcast else []), f"first={first}", f"delay={delay_s}"]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1",  # the script imports tests and jobs
                               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})


@pytest.mark.parametrize("settings", [["cluster.schedule=sync"],
                                      ["cluster.schedule=async", "algo.max_staleness=0", "transport.inflight=drain"]])
def test_the_synchronous_schedule_is_the_plain_update(tmp_path: Path, model_dir: Path, settings: list[str]) -> None:
    """The baseline is the pipeline with its numbers fixed: `cluster.schedule=sync`, and the asynchronous schedule
    set to max_staleness 0 and drain, make the by-hand update, trajectory for trajectory."""
    run_dir = tmp_path / "sync"
    proc = _run_world(run_dir, model_dir, settings)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    cfg = settings_of(run_dir)
    expected = by_hand(model_dir, cfg)
    published = dict(weights.iter_weights(weights.version_dir(run_dir, STEPS)))
    for k, v in expected.items():
        torch.testing.assert_close(published[k], v, rtol=0, atol=1e-7)
    report = json.loads((run_dir / "report" / "trainer.json").read_text())
    assert report["trajectories_trained"] == 8 * STEPS and report["dropped_stale"] == 0
    assert report["staleness_max"] == 0 and report["queue"]["consumed"] == 8 * STEPS
    assert report["schedule"] == settings[0].removeprefix("cluster.schedule=")
    ledger = json.loads((run_dir / "report" / "ledger.json").read_text())
    assert len(ledger["consumed"]) == 8 * STEPS and not ledger["excluded"] and not ledger["held_at_end"]


def test_decoupled_loss_changes_the_update_only_through_the_behaviour_weight(tmp_path: Path,
                                                                             model_dir: Path) -> None:
    """algo.offpolicy=decoupled reaches the trainer: with these batches' behaviour log-probs far from the
    policy's (π_prox/μ ≫ C), the truncated weight makes a different update than the behaviour ratio."""
    run_dir = tmp_path / "decoupled"
    proc = _run_world(run_dir, model_dir, ["algo.max_staleness=0", "algo.offpolicy=decoupled", "algo.is_cap=2.0"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cfg = settings_of(run_dir)
    assert cfg.algo.offpolicy == "decoupled"
    expected = by_hand(model_dir, cfg)
    behaviour = by_hand(model_dir, dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, offpolicy="behaviour")))
    published = dict(weights.iter_weights(weights.version_dir(run_dir, STEPS)))
    for k, v in expected.items():
        torch.testing.assert_close(published[k], v, rtol=0, atol=1e-7)
    assert max(float((behaviour[k] - v).abs().max()) for k, v in expected.items()) > 1e-4


def test_broadcast_delivers_the_published_weights(tmp_path: Path, model_dir: Path) -> None:
    """transport.weights=broadcast: the rollout rank holds, by the in-job broadcast, the very weights of the
    final version's directory, and the update is still the synchronous one."""
    run_dir = tmp_path / "bcast"
    proc = _run_world(run_dir, model_dir, ["algo.max_staleness=0", "transport.weights=broadcast"], broadcast=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads((run_dir / "report" / "broadcast.json").read_text())
    assert got == {"version": STEPS, "max_diff": 0.0, "names": True}
    cfg = settings_of(run_dir)
    expected = by_hand(model_dir, cfg)
    published = dict(weights.iter_weights(weights.version_dir(run_dir, STEPS)))
    for k, v in expected.items():
        torch.testing.assert_close(published[k], v, rtol=0, atol=1e-7)


def test_two_trainer_ranks_make_the_one_rank_update(tmp_path: Path, model_dir: Path) -> None:
    """cluster.trainer.ranks_per_node=2 (DDP): the hub receives, selects and sends each step's batch to the second
    rank, both take their share of the update, and the published weights are the plain update's (the ranks'
    summed gradients differ from one rank's only in float rounding), with the ledger of a one-rank run. The
    first batch comes 15 s late, past the 10 s collective timeout: the hub's keepalives hold the second rank's
    wait (without them gloo ends it)."""
    run_dir = tmp_path / "dp2"
    proc = _run_world(run_dir, model_dir, ["algo.max_staleness=0", "transport.inflight=drain", "trainer.parallel=ddp",
                                           "cluster.trainer.collective_timeout_s=10"], trainer_ranks=2, delay_s=15)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cfg = settings_of(run_dir)
    expected = by_hand(model_dir, cfg)
    published = dict(weights.iter_weights(weights.version_dir(run_dir, STEPS)))
    before = load_model(model_dir, 1).state_dict()
    for k, v in expected.items():
        torch.testing.assert_close(published[k], v, rtol=0, atol=1e-6)
    assert max(float((published[k] - before[k]).abs().max()) for k in expected) > 1e-3  # the steps moved them
    final = run_dir / "ckpt" / f"step-{STEPS}"
    assert json.loads((final / "trainer.json").read_text())["world_size"] == 2
    assert sorted(p.name for p in (final / "state").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert "[trainer-1]" in proc.stderr and f"step {STEPS}/{STEPS} trained on 8 of 8" in proc.stderr
    ledger = json.loads((run_dir / "report" / "ledger.json").read_text())
    assert len(ledger["consumed"]) == 8 * STEPS and not ledger["excluded"] and not ledger["held_at_end"]


def test_two_resumed_trainer_ranks_continue_the_update(tmp_path: Path, model_dir: Path) -> None:
    """A 2-rank (DDP) run of 2 steps, then the same run dir with trainer.steps=4: both ranks load the checkpoint
    (model, optimizer, scheduler), the hub drains the shards (the first steps' trajectories are consumed
    already) and takes the new ones; the end is the uninterrupted 4-step update."""
    run_dir = tmp_path / "resumed"
    extra = ["algo.max_staleness=0", "transport.inflight=drain", "trainer.parallel=ddp"]
    proc = _run_world(run_dir, model_dir, extra, trainer_ranks=2, steps=2)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    proc = _run_world(run_dir, model_dir, extra, trainer_ranks=2, steps=STEPS, first=2)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "resumed from" in proc.stderr and "trainer rank 1 of 2: taking its share of each step the hub selects " \
        "(from step 2)" in proc.stderr
    cfg = settings_of(run_dir)
    expected = by_hand(model_dir, cfg)
    published = dict(weights.iter_weights(weights.version_dir(run_dir, STEPS)))
    for k, v in expected.items():
        torch.testing.assert_close(published[k], v, rtol=0, atol=1e-6)
    ledger = json.loads((run_dir / "report" / "ledger.json").read_text())
    assert len(ledger["consumed"]) == 8 * STEPS and not ledger["excluded"] and not ledger["held_at_end"]
    assert "drained the shards: 0 held again, {'duplicate': 16}" in proc.stderr  # steps 0-1: trained already


def test_two_fsdp2_ranks_follow_one_rank_through_warm_start_and_kl(tmp_path: Path, model_dir: Path) -> None:
    """Warm start (every rank runs its share of the same imitation batches), the KL reference saved by the hub
    and loaded by every rank, then RL steps: 2 FSDP2 ranks end where 1 rank ends."""
    extra = ["algo.max_staleness=0", "transport.inflight=drain", "algo.kl_coef=0.05"]
    runs = {}
    for ranks, parallel in ((1, "none"), (2, "fsdp2")):
        run_dir = tmp_path / f"r{ranks}"
        proc = _run_world(run_dir, model_dir, [*extra, f"trainer.parallel={parallel}"], trainer_ranks=ranks,
                          warm_start_steps=2)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs[ranks] = run_dir
    # the warm-started weights (the KL reference the hub saved), then the last version
    one, two = (load_file(str(runs[r] / "ckpt" / "reference.safetensors")) for r in (1, 2))
    initial = load_model(model_dir, 1).state_dict()
    assert max(float((one[k] - initial[k]).abs().max()) for k in one) > 1e-4  # the warm start moved them
    for k, v in one.items():
        torch.testing.assert_close(two[k], v, rtol=0, atol=1e-6)
    one, two = (dict(weights.iter_weights(weights.version_dir(runs[r], STEPS))) for r in (1, 2))
    assert sorted(one) == sorted(two)
    for k, v in one.items():
        torch.testing.assert_close(two[k], v, rtol=0, atol=1e-6)
    reports = [json.loads((runs[r] / "report" / "trainer.json").read_text()) for r in (1, 2)]
    assert reports[0]["sft_steps"] == reports[1]["sft_steps"] == 2
    assert reports[0]["trajectories_trained"] == reports[1]["trajectories_trained"] == 8 * STEPS
