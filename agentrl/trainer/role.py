"""The trainer role on a synchronous schedule: warm start, then for each step read the rollout's shard,
update, publish weights v<N+1>, checkpoint every few steps.

Trajectories arrive as HDF5 shards (`shards/rollout-0/<step>.h5`, one per step); weights leave as
versioned safetensors directories. Infrastructure outcomes (env_error, cancelled) are counted, never
trained on; agent failures get `fail_penalty`. A restarted trainer resumes from the newest checkpoint
(`ckpt/step-<N>`: model, optimizer, scheduler, RNG, policy version, the ledger of consumed trajectory
ids, running totals) and skips the warm start; every rank of a data-parallel trainer runs `run` alike.
"""
from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from agentrl.algorithms.advantages import informative_groups
from agentrl.algorithms.staleness import fresh_mask, staleness
from agentrl.fsio import write_json_atomic
from agentrl.monitor.rollout_stats import rollout_metrics
from agentrl.trainer import checkpoint
from agentrl.trainer.batch import collate
from agentrl.trainer.checkpoint import TrainerState
from agentrl.trainer.imitation import reproduced_share
from agentrl.trainer.model_load import gathered_state_dict, load_policy, load_reference
from agentrl.trainer.parallel import Parallel
from agentrl.trainer.step import RLHyper, rl_step, sft_step
from agentrl.transport import weights as weights_io
from agentrl.transport.shards import ShardReader
from agentrl.types import Trajectory

log = logging.getLogger("agentrl.trainer")


@dataclass(frozen=True)
class Schedule:
    steps: int
    sft_steps: int
    sft_batch: int
    sft_lr: float
    sft_all_tokens: bool
    lr: float
    weight_decay: float
    max_staleness: int
    drop_uniform_groups: bool
    fail_penalty: float
    wait_timeout_s: float
    seed: int
    poll_s: float = 0.05
    warmup_steps: int = 0
    checkpoint_every: int = 0
    """ckpt/step-<N> every this many RL steps, after the last, and once after the warm start; 0: never."""
    keep_checkpoints: int = 2
    sft_successful_only: bool = True
    sft_target: float = 0.0
    sft_min_token_prob: float = 0.2
    sft_check_every: int = 50
    sft_holdout: int = 32
    update: str = "rl"
    lagging_max_staleness: int | None = None
    """The staleness bound of lagging-pool tokens (cross-policy sampling): max_staleness + the pool's refresh
    interval; None: max_staleness (no lagging pool)."""


def shaped_rewards(trajs: list[Trajectory], fail_penalty: float) -> list[float]:
    return [fail_penalty if t.status.is_agent_failure else float(t.reward) for t in trajs]


def check_control_run(s: Schedule, resume: Path | None) -> None:
    """The control run (`trainer.update=sft`) continues the warm start's own optimizer and sampling, which a
    checkpoint does not hold: it cannot be resumed, on either schedule (resumed, it would silently train RL)."""
    if s.update == "sft" and (resume is not None or s.sft_steps == 0):
        raise ValueError("trainer.update=sft (the control run) continues a warm start: it needs sft_steps > 0 "
                         f"and a fresh run dir, not a resumed one{f' (found {resume})' if resume else ''}")


def split_demos(demos: list[Trajectory], s: Schedule) -> tuple[list[Trajectory], list[Trajectory]]:
    """(what the warm start trains on, held-out successful demonstrations per task for `sft_target`)."""
    rng = random.Random(s.seed + 1)
    held: list[Trajectory] = []
    if s.sft_target > 0:
        for task in sorted({t.task for t in demos}):
            wins = [t for t in demos if t.task == task and t.metrics.get("success", 0.0) > 0]
            held += rng.sample(wins, min(s.sft_holdout, len(wins) // 4))
    ids = {t.traj_id for t in held}
    train = [t for t in demos if t.traj_id not in ids]
    if s.sft_successful_only:
        train = [t for t in train if t.metrics.get("success", 0.0) > 0]
    return train, held


class WarmStart:
    """Supervised steps on the scripted expert's trajectories: its successful ones (rejection sampling), or
    all of them (`sft_successful_only=False`: plain imitation of an imperfect expert, whose mistakes RL then
    unlearns). `run` takes at most `sft_steps`; with `sft_target > 0` it stops as soon as every task's
    held-out successful demonstrations are reproducible (`imitation.reproduced_share`), wherever that happens
    on this machine. `step` is one more update (the control run's steps, `trainer.update=sft`)."""

    def __init__(self, model: torch.nn.Module, demos: list[Trajectory], s: Schedule, h: RLHyper, pad_id: int,
                 par: Parallel | None = None) -> None:
        self.model, self.s, self.h, self.pad_id, self.par = model, s, h, pad_id, par or Parallel()
        self.train, self.held = split_demos(demos, s)
        if not self.train:
            raise RuntimeError("warm start: no expert trajectory to train on (none successful?)")
        self.opt = torch.optim.AdamW(model.parameters(), lr=s.sft_lr, weight_decay=0.0)
        # short linear warm-up, then constant: a decaying rate slowed the late copy skills more than it steadied them
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda i: min(1.0, (i + 1) / 10))
        self.rng = random.Random(s.seed)  # the same draws on every rank: each runs its share of the same batch
        self.done = 0

    def step(self) -> dict[str, float]:
        picked = self.rng.sample(self.train, min(self.s.sft_batch, len(self.train)))
        batch = collate(picked, [0.0] * len(picked), self.pad_id)
        self.model.train()
        stats = sft_step(self.model, self.opt, batch, self.h.grad_clip, self.h.micro_batch_tokens,
                         self.s.sft_all_tokens, self.par, self.h.packing)
        self.sched.step()
        self.done += 1
        return stats

    def run(self, monitor) -> dict[str, float]:
        """The warm start; returns the last step's statistics plus `sft_steps_done`."""
        s, stats = self.s, {}
        for i in range(s.sft_steps):
            if self.held and i % s.sft_check_every == 0 and _imitates(self.model, self.held, s, self.pad_id,
                                                                      monitor, i, self.par):
                break
            stats = self.step()
            monitor.scalars({f"sft/{k}": v for k, v in stats.items()}, i)
            if i % 50 == 0 or i == s.sft_steps - 1:
                log.info("sft step %d/%d loss %.4f token_acc %.3f", i + 1, s.sft_steps, stats["sft_loss"],
                         stats["sft_token_acc"])
        else:
            if self.held and not _imitates(self.model, self.held, s, self.pad_id, monitor, s.sft_steps, self.par):
                log.warning("warm start: %d steps (the cap) without reaching sft_target %.2f on every task",
                            s.sft_steps, s.sft_target)
        log.info("warm start done after %d steps", self.done)
        return {**stats, "sft_steps_done": float(self.done)}


def _imitates(model: torch.nn.Module, held: list[Trajectory], s: Schedule, pad_id: int, monitor, step: int,
              par: Parallel) -> bool:
    """Check `sft_target` on the held-out demonstrations (every rank runs it; rank 0's verdict counts)."""
    share = reproduced_share(model, held, pad_id, s.sft_min_token_prob)
    monitor.scalars({f"sft/reproduced/{task}": v for task, v in share.items()}, step)
    reached = bool(share) and min(share.values()) >= s.sft_target
    log.info("sft step %d: held-out successes reproducible %s%s", step,
             {k: round(v, 3) for k, v in share.items()}, " (target reached)" if reached else "")
    return bool(par.broadcast_object(reached))


def publish_weights(run_dir: Path, version: int, model: torch.nn.Module, par: Parallel,
                    base: Path | None = None) -> None:
    """Whole weights as weights/v<version> (gathered to rank 0 under FSDP2), a complete model directory
    beside `base`'s config and tokenizer files. Collective."""
    state = gathered_state_dict(model, par, weights_io.model_dtype(base) if base is not None else None)
    if par.is_main:
        weights_io.publish(run_dir, version, state, base=base)


def reference_model(run_dir: Path, model_dir: Path, threads: int, par: Parallel, warm_started: bool
                    ) -> torch.nn.Module:
    """The frozen KL reference: the policy as RL found it (after the warm start, if there was one), in the
    compute dtype and sharded like the policy (`model_load.load_reference`)."""
    state = None
    if warm_started and (par.is_main or not par.sharded):  # under FSDP2 rank 0 reads, the others get shards
        state = checkpoint.load_reference(run_dir)
        if state is None:
            raise FileNotFoundError(f"kl_coef > 0 but {checkpoint.ckpt_root(run_dir)} holds no reference weights "
                                    "(was the run started with kl_coef = 0?)")
    return load_reference(model_dir, threads, par, state)


def run(run_dir: Path, model_dir: Path, s: Schedule, h: RLHyper, threads: int, monitor,
        par: Parallel | None = None, should_stop: Callable[[], bool] | None = None) -> TrainerState:
    """Warm start (unless resuming), then RL steps s.steps; resumes from the newest ckpt/step-<N> if any.

    Every trainer rank runs this with the same arguments; `par` is the data-parallel layout.
    """
    par = par or Parallel()
    torch.manual_seed(s.seed)
    model = load_policy(model_dir, threads, par)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)  # padding is masked
    resume = par.broadcast_object(checkpoint.latest(run_dir))  # rank 0 decides: every rank must take the same path
    sft_steps_done = 0
    ws: WarmStart | None = None
    check_control_run(s, resume)
    if resume is None and s.sft_steps > 0:
        demos = ShardReader(run_dir / "shards" / "expert-0").wait(0, timeout_s=s.wait_timeout_s, poll_s=s.poll_s)
        log.info("warm start on %d expert trajectories", len(demos))
        ws = WarmStart(model, demos, s, h, pad_id, par)
        sft_steps_done = int(ws.run(monitor)["sft_steps_done"])
        if h.kl_coef > 0:
            state = par.full_state_dict(model)
            if par.is_main:
                checkpoint.save_reference(run_dir, state)
            par.barrier()
    ref_model = reference_model(run_dir, model_dir, threads, par, s.sft_steps > 0) if h.kl_coef > 0 else None

    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=s.weight_decay)
    warmup = max(s.warmup_steps, 1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / warmup))
    state = TrainerState()
    state.stats["sft_steps"] = float(sft_steps_done)
    if resume is not None:
        state = checkpoint.load(resume, model, opt, sched, par)
        log.info("resumed from %s: step %d, policy v%d, %d trajectories consumed", resume, state.step,
                 state.policy_version, len(state.consumed))
    if par.broadcast_object(resume is None or weights_io.latest_version(run_dir) < state.policy_version):
        publish_weights(run_dir, state.policy_version, model, par, model_dir)
        log.info("published weights v%d", state.policy_version)
    if resume is None and s.checkpoint_every:  # a restart from here skips the warm start
        checkpoint.save(run_dir, state, model, opt, sched, par, s.keep_checkpoints)

    reader = ShardReader(run_dir / "shards" / "rollout-0")
    for step in range(state.step, s.steps):
        t_wait = time.perf_counter()
        trajs = reader.wait(step, timeout_s=s.wait_timeout_s, poll_s=s.poll_s)
        t0 = time.perf_counter()
        fresh = [t for t in trajs if t.traj_id not in state.consumed]  # exactly once, across restarts too
        usable, rewards, counts = select_training_data(fresh, state.policy_version, s)
        counts["dropped_consumed"] = len(trajs) - len(fresh)
        stats: dict[str, float] = {}
        if ws is not None and s.update == "sft":  # the control run: imitation instead of RL, same number of updates
            stats = ws.step()
            counts["dropped_control"] = len(usable)  # the rollout's episodes are left out, and counted
            usable = []
        elif usable:
            batch = collate(usable, rewards, pad_id)
            model.train()
            stats = rl_step(model, opt, batch, h, ref_model, par)
        lr = opt.param_groups[0]["lr"]  # the rate this step used
        sched.step()
        state.step += 1
        state.policy_version += 1
        state.consumed.update(t.traj_id for t in fresh)
        n_tok = sum(t.num_tokens for t in usable)
        for k, v in {"trajectories_trained": len(usable), "tokens_trained": n_tok, "rl_steps": float(bool(stats)),
                     **counts}.items():
            if k != "staleness_max":
                state.stats[k] = state.stats.get(k, 0.0) + float(v)
        if par.is_main:  # before the weights: a rollout that sees v<N> finds the report of step N
            write_report(run_dir, state, s.steps)
        publish_weights(run_dir, state.policy_version, model, par, model_dir)
        stop = bool(par.broadcast_object(should_stop is not None and should_stop()))  # rank 0's signal counts
        if stop or s.checkpoint_every and (state.step % s.checkpoint_every == 0 or state.step == s.steps):
            checkpoint.save(run_dir, state, model, opt, sched, par, s.keep_checkpoints)
        dt = time.perf_counter() - t0
        metrics = {f"train/{k}": v for k, v in stats.items()}
        metrics.update(rollout_metrics(trajs))
        metrics.update({"train/lr": lr, "pipeline/batch_size": float(len(usable)),
                        "pipeline/trainer_wait_s": t0 - t_wait, "pipeline/train_tokens_per_s": n_tok / max(dt, 1e-9)})
        metrics.update({f"pipeline/{k}": float(v) for k, v in counts.items()})
        monitor.scalars(metrics, step)
        log.info("step %d/%d trained on %d of %d (%d in uniform groups) loss %.8f approx_kl %.4f grad_norm %.3f "
                 "(%.1fs)", step + 1, s.steps, len(usable), len(trajs), counts["dropped_uniform"],
                 stats.get("loss", 0.0), stats.get("approx_kl", 0.0), stats.get("grad_norm", 0.0), dt)
        if stop:
            log.info("preempted: checkpointed step %d (policy v%d, %d trajectories consumed); leaving for a requeue",
                     state.step, state.policy_version, len(state.consumed))
            break
    return state


def write_report(run_dir: Path, state: TrainerState, steps: int) -> None:
    """report/trainer.json: the running totals, with `rl_steps` = steps whose batch updated the weights."""
    totals = {k: (int(v) if float(v).is_integer() else v) for k, v in sorted(state.stats.items())}
    body = {"steps_done": state.step, "steps": steps, "policy_version": state.policy_version, **totals}
    body.setdefault("rl_steps", 0)
    write_json_atomic(run_dir / "report" / "trainer.json", body, indent=2)


def select_training_data(trajs: list[Trajectory], version: int, s: Schedule
                         ) -> tuple[list[Trajectory], list[float], dict[str, float]]:
    """What one step trains on, and why the rest was left out (every exclusion is counted).

    Infrastructure outcomes are never trained on; trajectories more than `max_staleness` versions old
    (lagging-pool tokens: `lagging_max_staleness`) are dropped; groups whose (shaped) rewards are all equal
    carry no GRPO signal and are dropped before task normalization could turn their zero advantages into a
    bias (see `informative_groups`).
    """
    usable = [t for t in trajs if not t.status.is_infra]
    counts = {"dropped_infra": len(trajs) - len(usable), "dropped_stale": 0, "dropped_uniform": 0,
              "staleness_max": 0}
    if usable:
        # current-pool tokens against max_staleness; lagging-pool ones (old on purpose) against their own bound
        stale = staleness_of(torch.tensor([t.oldest_version(lagging=False) for t in usable]), version)
        lagging = staleness_of(torch.tensor([t.oldest_version(lagging=True) for t in usable]), version)
        lag_bound = s.max_staleness if s.lagging_max_staleness is None else s.lagging_max_staleness
        keep = (fresh_mask(stale, s.max_staleness) & fresh_mask(lagging, lag_bound)).tolist()
        counts["dropped_stale"] = keep.count(False)
        counts["staleness_max"] = int(stale.max())
        usable = [t for t, k in zip(usable, keep) if k]
    rewards = shaped_rewards(usable, s.fail_penalty)
    if usable and s.drop_uniform_groups:
        ids = {g: i for i, g in enumerate(dict.fromkeys(t.group_id for t in usable))}
        keep = informative_groups(torch.tensor(rewards), torch.tensor([ids[t.group_id] for t in usable])).tolist()
        counts["dropped_uniform"] = keep.count(False)
        usable = [t for t, k in zip(usable, keep) if k]
        rewards = [r for r, k in zip(rewards, keep) if k]
    return usable, rewards, counts


def staleness_of(oldest_version: torch.Tensor, current: int) -> torch.Tensor:
    """Staleness of trajectories given their oldest action-token version (one column per trajectory)."""
    mask = (oldest_version >= 0).long()[:, None]
    return staleness(oldest_version[:, None].clamp(min=0), mask, current)
