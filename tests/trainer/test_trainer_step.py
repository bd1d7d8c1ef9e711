"""The train step's arrangement of the algorithm: target alignment, micro-batch invariance, on-policy ratios."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from agentrl.models import tiny
from agentrl.trainer.batch import collate, micro_batches
from agentrl.trainer.logprobs import token_logprobs
from agentrl.trainer.role import shaped_rewards
from agentrl.trainer.step import RLHyper, rl_step, sft_step
from agentrl.types import Status, Trajectory, TrajectoryBuilder, new_id


def _traj(rng: np.random.Generator, vocab: int, task: str, group: str, reward: float,
          status: Status = Status.COMPLETED) -> Trajectory:
    b = TrajectoryBuilder()
    for _ in range(int(rng.integers(1, 4))):
        b.add_context(rng.integers(5, vocab, int(rng.integers(3, 9))).tolist())
        n = int(rng.integers(2, 7))
        b.add_action(rng.integers(5, vocab, n).tolist(), (-rng.random(n) * 3).tolist(), 0, 0)
    return b.build(traj_id=new_id(), task=task, index="0", group_id=group, reward=reward, status=status, num_turns=1)


@pytest.fixture(scope="module")
def model(lookup_tokenizer):
    return tiny.build_model(lookup_tokenizer, 128, 1, 2, 256, 256, seed=0)


def _batch(vocab: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    trajs = [_traj(rng, vocab, task, f"{task}-{g}", float(rng.integers(0, 2)))
             for task in ("a", "b") for g in range(2) for _ in range(3)]
    return trajs, collate(trajs, [t.reward for t in trajs], pad_id=0)


def test_collate_aligns_everything_to_targets(lookup_tokenizer) -> None:
    trajs, batch = _batch(len(lookup_tokenizer))
    for row in range(len(trajs)):
        n = int(batch.attention[row].sum())
        t = next(t for t in trajs if t.num_tokens == n and np.array_equal(t.tokens, batch.tokens[row, :n].numpy()))
        assert batch.mask[row, : n - 1].tolist() == t.loss_mask[1:].astype(float).tolist()
        assert np.allclose(batch.behaviour_logp[row, : n - 1].numpy(), t.logprobs[1:])
        assert batch.mask[row, n - 1:].sum() == 0  # padding is never a target
    assert batch.group_index.unique().numel() == 4
    assert sorted(batch.task_names) == ["a", "b"]


def test_micro_batches_cover_rows_once_within_budget(lookup_tokenizer) -> None:
    _, batch = _batch(len(lookup_tokenizer))
    lengths = batch.attention.sum(1).tolist()
    for budget in (1, 40, 100, 10_000):
        slices = micro_batches(batch, budget)
        rows = [r for s in slices for r in range(s.start, s.stop)]
        assert rows == list(range(len(lengths)))
        for s in slices:
            assert s.stop - s.start == 1 or (s.stop - s.start) * max(lengths[s]) <= budget


def _update(model, batch, h: RLHyper) -> dict[str, torch.Tensor]:
    m = copy.deepcopy(model)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    rl_step(m, torch.optim.SGD(m.parameters(), lr=1.0), batch, h)
    return {k: v - before[k] for k, v in m.state_dict().items()}


def test_micro_batching_does_not_change_the_update(model, lookup_tokenizer) -> None:
    _, batch = _batch(len(lookup_tokenizer))
    whole = _update(model, batch, RLHyper(micro_batch_tokens=100_000, grad_clip=0.0))
    split = _update(model, batch, RLHyper(micro_batch_tokens=30, grad_clip=0.0))
    assert len(micro_batches(batch, 30)) > 3
    for k in whole:
        torch.testing.assert_close(split[k], whole[k], rtol=1e-4, atol=1e-6)
    assert any(v.abs().max() > 0 for v in whole.values())


def test_on_policy_batch_has_unit_ratio(model, lookup_tokenizer) -> None:
    _, batch = _batch(len(lookup_tokenizer))
    with torch.no_grad():
        logp, _ = token_logprobs(model, batch.tokens, batch.attention)
    batch.behaviour_logp = logp * batch.mask
    stats = rl_step(copy.deepcopy(model), torch.optim.SGD(model.parameters(), lr=0.0), batch, RLHyper())
    assert stats["clipfrac"] == 0.0 and abs(stats["approx_kl"]) < 1e-6
    for task in batch.task_names:  # task normalization ran before the loss
        assert abs(stats[f"adv/{task}/mean"]) < 1e-5 and abs(stats[f"adv/{task}/std"] - 1.0) < 1e-4


def test_sft_lowers_the_loss_of_its_batch(model, lookup_tokenizer) -> None:
    _, batch = _batch(len(lookup_tokenizer))
    m = copy.deepcopy(model)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    first = sft_step(m, opt, batch, 1.0, 10_000)["sft_loss"]
    for _ in range(10):
        last = sft_step(m, opt, batch, 1.0, 10_000)["sft_loss"]
    assert last < first * 0.8
    all_tok = sft_step(copy.deepcopy(model), torch.optim.SGD(m.parameters(), lr=0.0), batch, 1.0, 10_000, True)
    assert all_tok["sft_loss"] != pytest.approx(first)  # a different (larger) set of targets


def test_agent_failures_get_the_penalty_infra_is_never_shaped() -> None:
    rng = np.random.default_rng(0)
    ts = [_traj(rng, 50, "a", "g", 1.0), _traj(rng, 50, "a", "g", 0.0, Status.TURN_LIMIT),
          _traj(rng, 50, "a", "g", 0.0, Status.INVALID_ACTION), _traj(rng, 50, "a", "g", 0.0, Status.CONTEXT_LIMIT)]
    assert shaped_rewards(ts, -0.2) == [1.0, -0.2, -0.2, -0.2]
    assert Status.ENV_ERROR.is_infra and Status.CANCELLED.is_infra and not Status.TURN_LIMIT.is_infra


def test_select_training_data_counts_every_exclusion() -> None:
    from agentrl.trainer.role import Schedule, select_training_data

    rng = np.random.default_rng(1)
    s = Schedule(steps=1, sft_steps=0, sft_batch=1, sft_lr=1.0, sft_all_tokens=False, lr=1.0, weight_decay=0.0,
                 max_staleness=0, drop_uniform_groups=True, fail_penalty=-0.2, wait_timeout_s=1.0, seed=0)
    mixed = [_traj(rng, 50, "a", "mixed", 1.0), _traj(rng, 50, "a", "mixed", 0.0)]
    uniform = [_traj(rng, 50, "a", "uniform", 0.0), _traj(rng, 50, "a", "uniform", 0.0)]
    # a turn-limit failure is shaped to -0.2, so this group differs from a plain 0.0 and carries signal
    shaped = [_traj(rng, 50, "a", "shaped", 0.0), _traj(rng, 50, "a", "shaped", 0.0, Status.TURN_LIMIT)]
    infra = [_traj(rng, 50, "a", "mixed", 0.0, Status.ENV_ERROR)]
    trajs = mixed + uniform + shaped + infra
    used, rewards, counts = select_training_data(trajs, 0, s)
    assert [t.group_id for t in used] == ["mixed", "mixed", "shaped", "shaped"]
    assert rewards == [1.0, 0.0, 0.0, -0.2]
    assert counts["dropped_infra"] == 1 and counts["dropped_uniform"] == 2 and counts["dropped_stale"] == 0
    # one version later, with max_staleness 0, everything sampled by version 0 is too old
    used, _, counts = select_training_data(trajs, 1, s)
    assert used == [] and counts["dropped_stale"] == 6 and counts["staleness_max"] == 1
