"""The trainer role over fixed shards (no vLLM): a trainer killed with SIGKILL after a checkpoint resumes with
the next steps' losses and weights of an uninterrupted run, and with max_staleness = 0 on a synchronous
schedule the role makes exactly the update of plain `rl_step`s on each step's batch."""
from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import trainer_procs as procs_

from agentrl.config import dump_config, load_config
from agentrl.models import tiny
from agentrl.trainer import checkpoint, role
from agentrl.trainer.batch import collate
from agentrl.trainer.model_load import load_model
from agentrl.trainer.step import rl_step
from agentrl.transport import weights
from agentrl.transport.shards import write_shard
from agentrl.types import Status, Trajectory, TrajectoryBuilder
from jobs import trainer as trainer_job

STEPS = 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    corpus = [f"call lookup {i} then answer {i * 7}" for i in range(50)]
    tok = tiny.train_tokenizer(corpus, 300, ["<|end|>", "<|pad|>"], "{{ messages }}", "<|end|>", "<|pad|>")
    model = tiny.build_model(tok, 32, 2, 2, 64, 256, seed=3)
    return tiny.save(model, tok, tmp_path_factory.mktemp("model"))


def _trajs(step: int, n_groups: int = 2, vocab: int = 250) -> list[Trajectory]:
    """One step's rollout, sampled by weights v<step> (a synchronous schedule); rewards differ within groups."""
    rng = np.random.default_rng(100 + step)
    out = []
    for g in range(n_groups):
        for k in range(4):
            b = TrajectoryBuilder()
            for _ in range(int(rng.integers(1, 3))):
                b.add_context(rng.integers(5, vocab, int(rng.integers(3, 8))).tolist())
                n = int(rng.integers(2, 6))
                b.add_action(rng.integers(5, vocab, n).tolist(), (-rng.random(n) * 2 - 3).tolist(), step, 0)
            status = Status.TURN_LIMIT if k == 3 else Status.COMPLETED
            out.append(b.build(traj_id=f"s{step}-g{g}-{k}", task="lookup", index=str(g), group_id=f"s{step}-{g}",
                               reward=float(k % 2), status=status, num_turns=2, metrics={"success": 1.0}))
    return out


def _make_run(run_dir: Path, model_dir: Path, shards: range, sft_steps: int, kl_coef: float,
              extra: list[Trajectory] | None = None, parallel: str = "ddp") -> None:
    cfg = load_config(None, [f"model.path={model_dir}", f"trainer.steps={STEPS}", f"trainer.sft_steps={sft_steps}",
                             "trainer.sft_batch=4", "trainer.checkpoint_every=1", "trainer.threads=1",
                             "trainer.lr=0.003", "trainer.warmup_steps=2", "trainer.micro_batch_tokens=64",
                             f"algo.kl_coef={kl_coef}", "monitor.tensorboard=false", "cluster.role_timeout_s=120",
                             "transport.poll_s=0.02", f"trainer.parallel={parallel}"])
    run_dir.mkdir(parents=True)
    dump_config(cfg, run_dir / "config.yaml")
    (run_dir / "shards" / "expert-0").mkdir(parents=True)
    write_shard(run_dir / "shards" / "expert-0" / "000000.h5", _trajs(-1, 3))
    _write_rollouts(run_dir, shards, extra)


def _write_rollouts(run_dir: Path, shards: range, extra: list[Trajectory] | None) -> None:
    d = run_dir / "shards" / "rollout-0"
    d.mkdir(parents=True, exist_ok=True)
    for s in shards:
        # step 2 also carries a trajectory step 1 already took: the ledger must leave it out, across a restart too
        write_shard(d / f"{s:06d}.h5", _trajs(s) + (extra if s == 2 and extra else []))


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Every run here computes on one thread (as the trainer processes do): bit-equal float reductions."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _run_here(run_dir: Path) -> tuple[checkpoint.TrainerState, procs_.Recorder]:
    cfg = load_config(str(run_dir / "config.yaml"))
    schedule, hyper = trainer_job.plan(cfg)
    rec = procs_.Recorder()
    with one_thread():
        state = role.run(run_dir, Path(cfg.model.path), schedule, hyper, 1, rec)
    return state, rec


def _run_in_process(run_dir: Path, tmp: Path, name: str, ranks: int = 1) -> dict:
    """The trainer in processes of its own (`ranks` of them), like the killed one, so that every run compares
    like with like (the same thread count and environment, whatever earlier tests did to this process).
    Returns rank 0's record."""
    env = {"WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    procs = [procs_.start(procs_.trainer_run, (run_dir, tmp / name), tmp, f"{name}-{r}", {**env, "RANK": str(r)})
             for r in range(ranks)]
    procs_.join_all(procs, timeout_s=120)
    assert all(p.exitcode == 0 for p in procs), procs_.errors_of(tmp)
    return torch.load(f"{tmp / name}-0", weights_only=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_killed_trainer_resumes_with_the_uninterrupted_losses(tmp_path: Path, model_dir: Path) -> None:
    dup = [_trajs(1)[0]]
    killed = tmp_path / "killed"
    _make_run(killed, model_dir, range(2), sft_steps=2, kl_coef=0.05, extra=dup)
    # The trainer job, as its own process (see trainer_procs: no second import of torch). It trains steps 0
    # and 1, checkpoints, then waits for shard 2, which does not exist yet: kill it there, without warning.
    proc = procs_.start(procs_.trainer_job, (killed,), tmp_path, "trainer")
    deadline = time.monotonic() + 120
    try:
        while checkpoint.latest(killed) != killed / "ckpt" / "step-2" or (killed / "ckpt" / "step-0").exists():
            assert proc.is_alive(), f"trainer exited early ({proc.exitcode}): {procs_.errors_of(tmp_path)}"
            assert time.monotonic() < deadline, "no checkpoint step-2 within 120 s"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.join()
    assert proc.exitcode == -9
    assert sorted(p.name for p in (killed / "ckpt").iterdir()) == ["reference.safetensors", "step-1", "step-2"]

    _write_rollouts(killed, range(2, STEPS), dup)
    straight = tmp_path / "straight"
    _make_run(straight, model_dir, range(STEPS), sft_steps=2, kl_coef=0.05, extra=dup)
    back, whole = _run_in_process(killed, tmp_path, "resumed"), _run_in_process(straight, tmp_path, "straight")
    resumed_state, resumed, full_state, full = back["state"], back["values"], whole["state"], whole["values"]

    assert not any(k.startswith("sft/") for k in resumed)  # the warm start was not redone
    assert sorted(resumed["train/loss"]) == [2, 3]
    for step in (2, 3):  # step 2's loss needs the restored weights; step 3's the restored optimizer too
        for k in ("train/loss", "train/kl", "train/grad_norm", "train/lr", "pipeline/dropped_consumed"):
            assert abs(resumed[k][step] - full[k][step]) <= 1e-7, (k, step)
    assert resumed["train/kl"][3] > 0 and full["pipeline/dropped_consumed"][2] == 1
    assert full["train/lr"][0] < full["train/lr"][1] == full["train/lr"][3]  # warm-up ran
    a = dict(weights.iter_weights(weights.version_dir(killed, STEPS)))
    b = dict(weights.iter_weights(weights.version_dir(straight, STEPS)))
    for k in b:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-7)
    assert resumed_state.consumed == full_state.consumed and len(full_state.consumed) == 8 * STEPS
    assert resumed_state.stats == full_state.stats and resumed_state.policy_version == STEPS
    assert resumed_state.stats["trajectories_trained"] == 8 * STEPS


def test_max_staleness_zero_on_a_synchronous_schedule_is_the_plain_update(tmp_path: Path, model_dir: Path) -> None:
    run_dir = tmp_path / "sync"
    _make_run(run_dir, model_dir, range(STEPS), sft_steps=0, kl_coef=0.0)
    state, rec = _run_here(run_dir)
    assert all(v == 0 for v in rec.values["pipeline/dropped_stale"].values())

    # the synchronous trainer by hand: every step's whole batch, shaped rewards, one rl_step, v<N> after it
    cfg = load_config(str(run_dir / "config.yaml"))
    schedule, hyper = trainer_job.plan(cfg)
    with one_thread():
        model = load_model(model_dir, 1)
        opt = torch.optim.AdamW(model.parameters(), lr=schedule.lr, weight_decay=schedule.weight_decay)
        for step in range(STEPS):
            for g in opt.param_groups:  # the same linear warm-up
                g["lr"] = schedule.lr * min(1.0, (step + 1) / schedule.warmup_steps)
            trajs = _trajs(step)
            rl_step(model, opt, collate(trajs, role.shaped_rewards(trajs, schedule.fail_penalty), pad_id=1), hyper)
    published = dict(weights.iter_weights(weights.version_dir(run_dir, STEPS)))
    for k, v in model.state_dict().items():
        torch.testing.assert_close(published[k], v, rtol=0, atol=1e-7)
    assert state.stats["dropped_stale"] == 0 and state.stats["trajectories_trained"] == 8 * STEPS


@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_two_rank_trainer_role_follows_the_one_rank_run(tmp_path: Path, model_dir: Path, parallel: str) -> None:
    """The whole role on 2 gloo ranks (warm start, KL reference, RL steps, publishing, checkpoints) tracks the
    1-rank run: identical data, so per-step statistics agree to float noise (seen: 2e-6 relative after 4 AdamW
    steps; averaging the ranks' gradients instead of summing them is off by 1.5e-4, a rank alone by far more)."""
    runs = {}
    for ranks in (1, 2):
        run_dir = tmp_path / f"r{ranks}"
        _make_run(run_dir, model_dir, range(STEPS), sft_steps=2, kl_coef=0.05, parallel=parallel)
        runs[ranks] = _run_in_process(run_dir, tmp_path, f"r{ranks}", ranks)["values"]
    for k in ("train/loss", "train/kl", "train/entropy", "train/grad_norm", "sft/sft_loss"):
        for step, v in runs[1][k].items():
            assert runs[2][k][step] == pytest.approx(v, rel=2e-5, abs=1e-7), (k, step)  # seen: 2e-6
    assert json.loads((tmp_path / "r2" / "ckpt" / f"step-{STEPS}" / "trainer.json").read_text())["world_size"] == 2
    assert sorted(p.name for p in (tmp_path / "r2" / "ckpt" / f"step-{STEPS}" / "state").iterdir()) == \
        [".metadata", "__0_0.distcp", "__1_0.distcp"]
