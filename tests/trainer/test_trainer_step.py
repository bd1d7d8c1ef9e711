"""The train step's arrangement of the algorithm: target alignment, micro-batch plans, packing, invariance of the
update to the layout, on-policy ratios, KL to the frozen reference, mixed precision."""
from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest
import torch
from naive_rl import entropy_from_logits

from agentrl.config import AlgoConfig, TrainerConfig
from agentrl.models import tiny
from agentrl.trainer import attention
from agentrl.trainer.batch import collate, layout, padding_fraction, plan_micro_batches
from agentrl.trainer.logprobs import entropy_from_log_probs, full_vocab_logprobs, head_outputs, token_logprobs
from agentrl.trainer.select import shaped_rewards
from agentrl.trainer.step import rl_step, warm_start_step
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


def test_micro_batch_plans_by_hand() -> None:
    lengths = [5, 4, 3, 2, 1]  # sorted longest first, as collate leaves them
    # padded: rows of one trajectory; [0, 1] fill 2 x 5 = 10 slots, then [2, 3, 4] fill 3 x 3 = 9
    assert plan_micro_batches(lengths, 10, packing=False) == [[[0], [1]], [[2], [3], [4]]]
    assert padding_fraction(plan_micro_batches(lengths, 10, False), lengths) == pytest.approx(4 / 19)
    # packed: first-fit decreasing into rows of 5 tokens -> [0], [1, 4], [2, 3]; two rows per micro-batch
    assert plan_micro_batches(lengths, 10, packing=True) == [[[0], [1, 4]], [[2, 3]]]
    assert padding_fraction(plan_micro_batches(lengths, 10, True), lengths) == 0.0
    assert plan_micro_batches([7, 3], 4, packing=False) == [[[0]], [[1]]]  # over budget: alone


@pytest.mark.parametrize("packed", [False, True])
def test_micro_batch_plans_cover_every_trajectory_once_within_budget(lookup_tokenizer, packed: bool) -> None:
    _, batch = _batch(len(lookup_tokenizer))
    lengths = batch.lengths
    for budget in (1, 40, 100, 10_000):
        rows = plan_micro_batches(lengths, budget, packed)
        assert sorted(i for mb in rows for row in mb for i in row) == list(range(len(lengths)))
        for mb in rows:
            fills = [sum(lengths[i] for i in row) for row in mb]
            assert all(len(row) == 1 for row in mb) or packed
            assert len(mb) * max(fills) <= max(budget, max(lengths))
    assert padding_fraction(plan_micro_batches(lengths, 10_000, True), lengths) < \
        padding_fraction(plan_micro_batches(lengths, 10_000, False), lengths)


@pytest.mark.parametrize("attn", ["sdpa", "varlen"])
def test_packed_rows_give_each_trajectory_its_own_log_probs(model, lookup_tokenizer, attn: str) -> None:
    """Attention within each packed trajectory only (SDPA's block-diagonal mask from restarting position ids, or
    the varlen path's segments): a packed trajectory's log-probs are those it has alone in a padded row (this fails
    if tokens attended across trajectories, or positions ran on)."""
    _, batch = _batch(len(lookup_tokenizer))
    adv = torch.randn(batch.mask.shape)
    m = copy.deepcopy(model)
    assert attention.apply(m, attn, torch.device("cpu")) == attn
    with torch.no_grad():
        padded, _ = full_vocab_logprobs(model, batch.tokens, batch.attention)
        rows = plan_micro_batches(batch.lengths, 10_000, packing=True)
        mb = layout(batch, rows[0], {"mask": batch.mask, "logp": padded, "adv": adv}, packing=True)
        assert mb.tokens.shape[0] < len(batch.lengths)  # several trajectories share a row
        logp, _, _ = head_outputs(m, mb)
    on = mb.targets["mask"] > 0
    assert int(on.sum()) == batch.num_action_tokens == logp.numel()
    torch.testing.assert_close(mb.grid(logp)[on], mb.targets["logp"][on], rtol=0, atol=2e-5)
    assert torch.equal(mb.targets["adv"][on].sort().values, adv[batch.mask > 0].sort().values)


def _update(model, batch, algo: AlgoConfig, trainer: TrainerConfig, ref=None) -> dict[str, torch.Tensor]:
    m = copy.deepcopy(model)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    rl_step(m, torch.optim.SGD(m.parameters(), lr=1.0), batch, algo, trainer, 1.0, ref)
    return {k: v - before[k] for k, v in m.state_dict().items()}


@pytest.mark.parametrize("packed", [False, True])
def test_micro_batching_and_packing_do_not_change_the_update(model, lookup_tokenizer, packed: bool) -> None:
    _, batch = _batch(len(lookup_tokenizer))
    whole = _update(model, batch, AlgoConfig(), TrainerConfig(micro_batch_tokens=100_000, grad_clip=0.0, packing=False))
    split = _update(model, batch, AlgoConfig(), TrainerConfig(micro_batch_tokens=30, grad_clip=0.0, packing=packed))
    assert len(plan_micro_batches(batch.lengths, 30, packed)) > 3
    for k in whole:
        torch.testing.assert_close(split[k], whole[k], rtol=1e-4, atol=1e-6)
    assert any(v.abs().max() > 0 for v in whole.values())


def test_kl_to_the_frozen_reference_is_in_the_loss(model, lookup_tokenizer) -> None:
    _, batch = _batch(len(lookup_tokenizer))
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        logp, _ = token_logprobs(model, batch.tokens, batch.attention)
        ref_logp, _ = token_logprobs(ref, batch.tokens, batch.attention)
    on = batch.mask > 0
    with torch.no_grad():
        naive_entropy = entropy_from_logits(model(input_ids=batch.tokens, attention_mask=batch.attention).logits[:, :-1])
    for est in ("k1", "k2", "k3"):
        algo, trainer = AlgoConfig(kl_coef=0.5, kl_estimator=est), TrainerConfig(grad_clip=0.0, micro_batch_tokens=40)
        stats = rl_step(copy.deepcopy(model), torch.optim.SGD(model.parameters(), lr=0.0), batch, algo, trainer, 1.0,
                        ref)
        log_r = (ref_logp - logp)[on]
        naive = {"k1": -log_r, "k2": 0.5 * log_r**2, "k3": log_r.exp() - 1 - log_r}[est].mean()
        assert stats["kl"] == pytest.approx(float(naive), rel=1e-4)
        assert stats["loss"] == pytest.approx(stats["pg_loss"] + 0.5 * stats["kl"], rel=1e-5)
        assert stats["entropy"] == pytest.approx(float(naive_entropy[on].mean()), rel=1e-5)
    with_kl = _update(model, batch, AlgoConfig(kl_coef=0.5), TrainerConfig(grad_clip=0.0), ref)
    without = _update(model, batch, AlgoConfig(), TrainerConfig(grad_clip=0.0), ref)
    assert max(float((with_kl[k] - without[k]).abs().max()) for k in with_kl) > 1e-6
    with pytest.raises(ValueError, match="reference"):
        rl_step(copy.deepcopy(model), torch.optim.SGD(model.parameters(), lr=0.0), batch, AlgoConfig(kl_coef=0.1),
                TrainerConfig(), 1.0)


@pytest.mark.parametrize("seed", range(4))
def test_naive_entropy_matches_loop(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, 3, 7, generator=g, dtype=torch.float64) * 2
    logits[0, 0, :3] = -torch.inf  # masked vocabulary entries
    got = entropy_from_logits(logits)
    for b in range(2):
        for t in range(3):
            z = [math.exp(v) for v in logits[b, t].tolist()]
            p = [v / sum(z) for v in z]
            assert got[b, t].item() == pytest.approx(-sum(q * math.log(q) for q in p if q > 0), rel=1e-10)


def test_naive_entropy_hand_computed_and_finite_gradient() -> None:
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, -torch.inf, 5.0, -torch.inf]]], requires_grad=True)
    h = entropy_from_logits(logits)
    assert h[0, 0].item() == pytest.approx(math.log(4))
    h.sum().backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
    assert entropy_from_logits(torch.zeros(1, 1, 3, dtype=torch.bfloat16)).dtype == torch.float32


def test_entropy_from_log_probs_matches_the_logits_version() -> None:
    logits = torch.randn(3, 5, 11) * 4
    logits[0, 0, :4] = float("-inf")  # a masked vocabulary
    log_probs = torch.log_softmax(logits, -1)
    torch.testing.assert_close(entropy_from_log_probs(log_probs), entropy_from_logits(logits))
    assert torch.isfinite(entropy_from_log_probs(log_probs)).all()


def test_bf16_autocast_update_points_the_same_way(model, lookup_tokenizer) -> None:
    """Mixed precision on CPU (bf16 autocast): not exact, but the same update direction as float32."""
    from agentrl.trainer.parallel import Parallel

    _, batch = _batch(len(lookup_tokenizer))
    out = {}
    for mp in ("fp32", "bf16"):
        m = copy.deepcopy(model)
        before = torch.cat([p.detach().flatten().clone() for p in m.parameters()])
        rl_step(m, torch.optim.SGD(m.parameters(), lr=1.0), batch, AlgoConfig(), TrainerConfig(grad_clip=0.0), 1.0,
                par=Parallel(mixed_precision=mp))
        out[mp] = torch.cat([p.detach().flatten() for p in m.parameters()]) - before
    cos = torch.nn.functional.cosine_similarity(out["fp32"], out["bf16"], dim=0)
    assert 0.95 < float(cos) and not torch.equal(out["fp32"], out["bf16"])


def test_on_policy_batch_has_unit_ratio(model, lookup_tokenizer) -> None:
    _, batch = _batch(len(lookup_tokenizer))
    with torch.no_grad():
        logp, _ = token_logprobs(model, batch.tokens, batch.attention)
    batch.behaviour_logp = logp * batch.mask
    stats = rl_step(copy.deepcopy(model), torch.optim.SGD(model.parameters(), lr=0.0), batch, AlgoConfig(),
                    TrainerConfig(), 1.0)
    assert stats["clipfrac"] == 0.0 and abs(stats["approx_kl"]) < 1e-6
    for task in batch.task_names:  # task normalization ran before the loss
        assert abs(stats[f"adv/{task}/mean"]) < 1e-5 and abs(stats[f"adv/{task}/std"] - 1.0) < 1e-4


def test_sft_lowers_the_loss_of_its_batch(model, lookup_tokenizer) -> None:
    _, batch = _batch(len(lookup_tokenizer))
    m = copy.deepcopy(model)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    t = TrainerConfig(grad_clip=1.0, micro_batch_tokens=10_000)
    first = warm_start_step(m, opt, batch, t)["sft_loss"]
    for _ in range(10):
        last = warm_start_step(m, opt, batch, t)["sft_loss"]
    assert last < first * 0.8
    all_tok = warm_start_step(copy.deepcopy(model), torch.optim.SGD(m.parameters(), lr=0.0), batch,
                       dataclasses.replace(t, warm_start_all_tokens=True))
    assert all_tok["sft_loss"] != pytest.approx(first)  # a different (larger) set of targets


def test_agent_failures_get_the_penalty_infra_is_never_shaped() -> None:
    rng = np.random.default_rng(0)
    ts = [_traj(rng, 50, "a", "g", 1.0), _traj(rng, 50, "a", "g", 0.0, Status.TURN_LIMIT),
          _traj(rng, 50, "a", "g", 0.0, Status.INVALID_ACTION), _traj(rng, 50, "a", "g", 0.0, Status.CONTEXT_LIMIT)]
    assert shaped_rewards(ts, -0.2) == [1.0, -0.2, -0.2, -0.2]
    assert Status.ENV_ERROR.is_infra and Status.CANCELLED.is_infra and not Status.TURN_LIMIT.is_infra


def test_select_training_data_counts_every_exclusion() -> None:
    from agentrl.trainer.select import select_training_data

    rng = np.random.default_rng(1)
    s = dict(max_staleness=0, lagging_max_staleness=0, fail_penalty=-0.2, drop_uniform_groups=True)
    mixed = [_traj(rng, 50, "a", "mixed", 1.0), _traj(rng, 50, "a", "mixed", 0.0)]
    uniform = [_traj(rng, 50, "a", "uniform", 0.0), _traj(rng, 50, "a", "uniform", 0.0)]
    # a turn-limit failure is shaped to -0.2, so this group differs from a plain 0.0 and carries signal
    shaped = [_traj(rng, 50, "a", "shaped", 0.0), _traj(rng, 50, "a", "shaped", 0.0, Status.TURN_LIMIT)]
    infra = [_traj(rng, 50, "a", "mixed", 0.0, Status.ENV_ERROR)]
    trajs = mixed + uniform + shaped + infra
    used, rewards, counts = select_training_data(trajs, 0, **s)
    assert [t.group_id for t in used] == ["mixed", "mixed", "shaped", "shaped"]
    assert rewards == [1.0, 0.0, 0.0, -0.2]
    assert counts["dropped_infra"] == 1 and counts["dropped_uniform"] == 2 and counts["dropped_stale"] == 0
    # one version later, with max_staleness 0, everything sampled by version 0 is too old
    used, _, counts = select_training_data(trajs, 1, **s)
    assert used == [] and counts["dropped_stale"] == 6 and counts["staleness_max"] == 1


def test_synchronous_selection_bounds_lagging_pool_tokens_apart() -> None:
    """Cross-policy sampling: tokens of a lagging engine (id >= 1000) may be `lagging_max_staleness` old."""
    from agentrl.trainer.select import select_training_data
    from agentrl.types import LAGGING_ENGINE_BASE

    def traj(tid: str, reward: float, lagging_version: int) -> Trajectory:
        b = TrajectoryBuilder()
        b.add_context([1, 2])
        b.add_action([3, 4], [-0.5, -0.5], version=5, engine=0)
        b.add_action([5], [-0.5], version=lagging_version, engine=LAGGING_ENGINE_BASE)
        return b.build(traj_id=tid, task="a", index="0", group_id="g", reward=reward, status=Status.COMPLETED,
                       num_turns=2)

    trajs = [traj("x", 1.0, 3), traj("y", 0.0, 1)]  # lagging tokens 2 and 4 versions old, current ones 0
    base = dict(max_staleness=0, drop_uniform_groups=False, fail_penalty=-0.2)
    used, _, counts = select_training_data(trajs, 5, **base, lagging_max_staleness=3)
    assert [t.traj_id for t in used] == ["x"] and counts["dropped_stale"] == 1
    used, _, counts = select_training_data(trajs, 5, **base, lagging_max_staleness=0)  # no lagging pool's slack
    assert used == [] and counts["dropped_stale"] == 2
