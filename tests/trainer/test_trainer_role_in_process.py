"""The trainer role's hub loop in this process, over the in-memory channel (no mpiexec): a scripted rollout
rank on a thread plays a synchronous rollout (step k's batch once v<k> is announced), and the role makes the
by-hand update, writes the ledger, and counts what arrives after its last step as left at the end."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
from scripted_batches import STEPS, by_hand, one_thread, scripted_model, settings_of, step_batch

from agentrl.config import dump_config, load_config
from agentrl.monitor.tensorboard import NullMonitor
from agentrl.trainer import checkpoint, role
from agentrl.transport import weights
from agentrl.transport.shards import ShardWriter, shard_dir
from tests.transport.memory_channel import MemoryWorld


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scripted_model(tmp_path_factory.mktemp("model"))


def _scripted_rollout(world: MemoryWorld, run_dir: Path, errors: list[BaseException], extra: bool) -> None:
    try:
        ch = world.rollout(0, timeout_s=60)
        writer = ShardWriter(shard_dir(run_dir, "rollout", 0))
        for k in range(STEPS + extra):  # `extra`: one batch more than the trainer will take
            while ch.version < k and not ch.stopped:
                ch.wait_notice(5.0)
            batch = step_batch(k)
            writer.write(batch)  # durable first, as the real rank
            ch.send(batch, timeout_s=60)
        while not ch.stopped:
            ch.wait_notice(5.0)
        ch.close(timeout_s=5)
    except BaseException as e:  # noqa: BLE001 - reported by the test
        errors.append(e)


@pytest.mark.parametrize("extra,recompute", [(False, False), (True, False), (False, True)])
def test_hub_loop_in_process_makes_the_synchronous_update(tmp_path: Path, model_dir: Path, extra: bool,
                                                           recompute: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """`recompute`: with activation checkpointing (the layers' activations recomputed in the backward pass),
    the same update. Every checkpoint holds the queue's ledger of its step at the moment it is renamed into
    place (a kill right after the rename must not leave a checkpoint without it)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = load_config(None, [f"model.path={model_dir}", f"trainer.steps={STEPS}", "trainer.warm_start_steps=0",
                             "trainer.checkpoint_every=2", "trainer.threads=1", "trainer.lr=0.003",
                             "trainer.warmup_steps=2", "trainer.micro_batch_tokens=64", "monitor.tensorboard=false",
                             "cluster.role_timeout_s=60", "transport.poll_s=0.005", "cluster.schedule=sync",
                             "rollout.groups_per_task=2", "rollout.group_size=4",
                             f"trainer.activation_checkpointing={str(recompute).lower()}"])
    dump_config(cfg, run_dir / "config.yaml")
    world = MemoryWorld(1)
    errors: list[BaseException] = []
    rollout = threading.Thread(target=_scripted_rollout, args=(world, run_dir, errors, extra), daemon=True)
    rollout.start()
    at_rename: dict[str, list[str] | None] = {}
    real_replace = checkpoint.os.replace

    def replace(src, dst) -> None:
        if Path(src).name.startswith(".tmp-step-"):
            queue = Path(src) / role.QUEUE_FILE
            at_rename[Path(dst).name] = json.loads(queue.read_text())["consumed"] if queue.exists() else None
        real_replace(src, dst)

    monkeypatch.setattr(checkpoint.os, "replace", replace)
    with one_thread():
        state = role.run(run_dir, model_dir, cfg, NullMonitor(), channel_factory=lambda v: world.trainer(v, 60))
    rollout.join(30)
    assert not rollout.is_alive() and not errors, errors

    expected = by_hand(model_dir, settings_of(run_dir))
    published = dict(weights.iter_weights(weights.version_dir(run_dir, STEPS)))
    for k, v in expected.items():
        torch.testing.assert_close(published[k], v, rtol=0, atol=1e-7)
    assert state.step == STEPS and state.policy_version == STEPS and len(state.consumed) == 8 * STEPS
    report = json.loads((run_dir / "report" / "trainer.json").read_text())
    assert report["schedule"] == "sync" and report["trajectories_trained"] == 8 * STEPS
    assert report.get("left_at_end/held", 0) == (8 if extra else 0) and report["ranks_not_closed"] == 0
    ledger = json.loads((run_dir / "report" / "ledger.json").read_text())
    assert sorted(ledger["consumed"]) == sorted(t.traj_id for k in range(STEPS) for t in step_batch(k))
    assert sorted(ledger["held_at_end"]) == sorted(t.traj_id for t in step_batch(STEPS)) if extra else \
        ledger["held_at_end"] == []
    assert sorted(p.name for p in (run_dir / "ckpt").iterdir()) == ["step-2", "step-4"]  # keep_checkpoints 2
    ids = [sorted(t.traj_id for k in range(n) for t in step_batch(k)) for n in range(STEPS + 1)]
    assert at_rename == {f"step-{n}": ids[n] for n in (0, 2, 4)}  # step-0: before RL, nothing consumed
