"""A warm start saved in a checkpoint continues exactly as if it had never stopped (a control run resumed, or
started from its RL run's warm start), and `trainer.warm_start_from` shares a warm start only between runs that
would have made the same one."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agentrl.config import TrainerConfig, dump_config, load_config
from agentrl.launch.fork import fork_warm_start, mismatches
from agentrl.models import tiny
from agentrl.monitor.tensorboard import NullMonitor
from agentrl.trainer import checkpoint
from agentrl.trainer.checkpoint import WARM_FILE, TrainerState
from agentrl.trainer.parallel import Parallel
from agentrl.trainer.warm_start import WarmStart, check_control_run
from agentrl.types import Status, TrajectoryBuilder


def _demos(n: int) -> list:
    out = []
    for i in range(n):
        b = TrajectoryBuilder()
        b.add_context([5 + i % 7, 9, 11 + i % 5])
        b.add_action([20 + i % 11, 31, 40 + i % 3], [-0.1, -0.2, -0.3], 0, 0)
        out.append(b.build(traj_id=f"d{i}", task="lookup", index=str(i), group_id=f"g{i}", reward=1.0,
                           status=Status.COMPLETED, num_turns=1, metrics={"success": 1.0}))
    return out


def _learner_parts(tokenizer, seed: int, t: TrainerConfig, demos: list, rates=None):
    model = tiny.build_model(tokenizer, 32, 1, 1, 64, 128, seed=seed)
    warm = WarmStart(model, demos, t, 0, 0, rates=rates)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
    return model, warm, opt, sched


def test_a_warm_start_restored_from_a_checkpoint_takes_the_same_next_steps(tmp_path: Path, lookup_tokenizer) -> None:
    """Weights, the warm start's Adam moments, its schedule and its draws all come back: two more control steps
    after a restore give bit-identical weights to two more steps of the warm start that never stopped."""
    t = TrainerConfig(warm_start_steps=3, warm_start_batch=4, control_batch=6, warm_start_lr=1e-2, warm_start_warmup_steps=5, update="warm_start")
    demos = _demos(40)
    model, warm, opt, sched = _learner_parts(lookup_tokenizer, 0, t, demos)
    warm.run(NullMonitor())
    checkpoint.save(tmp_path, TrainerState(), model, opt, sched, Parallel(), warm=(warm.opt, warm.state_dict()))
    for _ in range(2):
        warm.step(t.control_batch)
    saved = checkpoint.warm_state(tmp_path / "ckpt" / "step-0")
    assert saved is not None and saved["done"] == 3
    other, warm2, opt2, sched2 = _learner_parts(lookup_tokenizer, 1, t, demos, rates=(saved["sft_lr"], saved["lr"]))
    checkpoint.load(tmp_path / "ckpt" / "step-0", other, opt2, sched2, Parallel(), warm2.opt)
    warm2.load_state_dict(saved)
    assert warm2.sched.get_last_lr() == pytest.approx([1e-2 * 4 / 5])  # mid warm-up: the 4th step's rate
    for _ in range(2):
        warm2.step(t.control_batch)
    for (name, a), b in zip(model.named_parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_a_warm_start_restored_without_its_optimizer_state_would_differ(tmp_path: Path, lookup_tokenizer) -> None:
    """The check above can fail: the same restore with fresh Adam moments ends elsewhere."""
    t = TrainerConfig(warm_start_steps=3, warm_start_batch=4, control_batch=6, warm_start_lr=1e-2, warm_start_warmup_steps=0, update="warm_start")
    demos = _demos(40)
    model, warm, opt, sched = _learner_parts(lookup_tokenizer, 0, t, demos)
    warm.run(NullMonitor())
    checkpoint.save(tmp_path, TrainerState(), model, opt, sched, Parallel(), warm=(warm.opt, warm.state_dict()))
    warm.step(t.control_batch)
    other, warm2, opt2, sched2 = _learner_parts(lookup_tokenizer, 1, t, demos, rates=(1e-2, 1e-4))
    checkpoint.load(tmp_path / "ckpt" / "step-0", other, opt2, sched2, Parallel())  # no warm optimizer
    warm2.load_state_dict(checkpoint.warm_state(tmp_path / "ckpt" / "step-0"))
    warm2.step(t.control_batch)
    assert any(not torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters(), strict=True))


def test_the_warm_starts_step_0_outlives_pruning_and_an_rl_checkpoint_cannot_resume_a_control(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    for n in range(4):
        (root / f"step-{n}").mkdir(parents=True)
        (root / f"step-{n}" / "trainer.json").write_text("{}")
    (root / "step-0" / WARM_FILE).write_text("{}")
    checkpoint._prune(root, 2)
    assert sorted(p.name for p in root.iterdir()) == ["step-0", "step-2", "step-3"]
    (root / "step-0" / WARM_FILE).unlink()
    checkpoint._prune(root, 2)
    assert sorted(p.name for p in root.iterdir()) == ["step-2", "step-3"]
    t = TrainerConfig(warm_start_steps=2, update="warm_start")
    with pytest.raises(ValueError, match="holds no warm-start state"):
        check_control_run(t, root / "step-3")
    (root / "step-3" / WARM_FILE).write_text("{}")
    check_control_run(t, root / "step-3")  # a control run's own checkpoint


def test_only_settings_after_the_warm_start_may_differ_from_its_source() -> None:
    source = load_config("smoke")
    same = load_config("smoke", ["trainer.update=warm_start", "algo.task_norm=false", "trainer.steps=7",
                                 "rollout.lagging_prob=0.5", "cluster.rollout.lagging_engines_per_rank=1",
                                 "trainer.warm_start_from=x"])
    assert mismatches(source, same) == []
    other = load_config("smoke", ["trainer.warm_start_steps=6", "rollout.temperature=0.7", "seed=3"])
    named = " ".join(mismatches(source, other))
    assert "trainer.warm_start_steps (5 there, 6 here)" in named and "rollout.temperature" in named and "seed" in named


def _source_run(root: Path, warm: bool = True) -> Path:
    src = root / "rl"
    step0 = src / "ckpt" / "step-0"
    (step0 / "state").mkdir(parents=True)
    (step0 / "trainer.json").write_text(json.dumps({"step": 0}))
    if warm:
        (step0 / WARM_FILE).write_text(json.dumps({"done": 5}))
    (src / "shards" / "expert-0").mkdir(parents=True)
    (src / "shards" / "expert-0" / "part-0.h5").write_bytes(b"demos")
    (src / "report").mkdir()
    (src / "report" / "before_rl.json").write_text(json.dumps({"version": 0}))
    dump_config(load_config("smoke", ["name=rl", f"run_root={root}"]), src / "config.yaml")
    return src


def test_a_fork_copies_the_warm_start_and_its_evaluation_and_refuses_what_is_not_the_same(tmp_path: Path) -> None:
    src = _source_run(tmp_path)
    cfg = load_config("smoke", ["name=control", f"run_root={tmp_path}", "trainer.update=warm_start",
                                f"trainer.warm_start_from={src}"])
    dest = tmp_path / "control"
    dest.mkdir()
    line = fork_warm_start(cfg, dest)
    assert "ckpt/step-0" in line and "report/before_rl.json" in line
    assert json.loads((dest / "ckpt" / "step-0" / WARM_FILE).read_text()) == {"done": 5}
    assert (dest / "shards" / "expert-0" / "part-0.h5").read_bytes() == b"demos"
    assert json.loads((dest / "report" / "before_rl.json").read_text()) == {"version": 0}
    assert checkpoint.latest(dest) == dest / "ckpt" / "step-0"  # the run resumes from it
    other = load_config("smoke", ["name=x", f"run_root={tmp_path}", "trainer.warm_start_batch=8",
                                  f"trainer.warm_start_from={src}"])
    with pytest.raises(ValueError, match=r"different warm start .*trainer.warm_start_batch \(16 there, 8 here\)"):
        fork_warm_start(other, tmp_path / "x")
    bare = _source_run(tmp_path / "b", warm=False)
    cfg = load_config("smoke", ["name=y", f"run_root={tmp_path / 'b'}", f"trainer.warm_start_from={bare}"])
    with pytest.raises(ValueError, match="no finished warm start"):
        fork_warm_start(cfg, tmp_path / "y")
    with pytest.raises(ValueError, match="must be set here too"):
        load_config("smoke", ["trainer.warm_start_steps=0", "trainer.warm_start_from=x"])
