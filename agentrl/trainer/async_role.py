"""The trainer role on the asynchronous schedule (design §6, docs/pipeline.md): trajectories arrive over MPI
from any number of rollout ranks while the trainer trains; every step takes the complete GRPO groups
available (`min_groups`..`max_groups`), trains once, publishes v<N+1> and tells the rollout ranks.

    warm start (as the synchronous role) → publish v0
    loop: receive (while the queue has room) → take groups → select → rl_step → publish v<N+1> → notify
    close the channel: rollout ranks stop; what arrives after the last step is counted `left_at_end`

What is shared with the synchronous role (warm start, model loading, data selection, publishing) is
imported from `agentrl.trainer.role`; only the schedule differs. With several (data-parallel) trainer ranks,
rank 0 is the hub: it alone talks to the rollout ranks, keeps the queue and publishes; each step it sends
the batch it selected to the other ranks (`torch.distributed`), and every rank takes its share of the update.
The queue (`TrajectoryQueue`) holds the exactly-once ledger; it is saved beside each checkpoint
(`queue.json`), and a restarted trainer drains the rollout shards into it, so nothing consumed is trained
twice and nothing produced is lost silently.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentrl.fsio import write_json_atomic
from agentrl.trainer import checkpoint
from agentrl.trainer.batch import collate
from agentrl.trainer.checkpoint import TrainerState
from agentrl.trainer.model_load import gathered_state_dict, load_policy
from agentrl.trainer.parallel import Parallel
from agentrl.trainer.role import (
    Schedule,
    WarmStart,
    check_control_run,
    publish_weights,
    reference_model,
    select_training_data,
)
from agentrl.trainer.step import RLHyper, rl_step
from agentrl.transport import weights as weights_io
from agentrl.transport.queue import TrajectoryQueue, trajectory_staleness
from agentrl.transport.shards import ShardReader, rank_dirs
from agentrl.types import Trajectory

log = logging.getLogger("agentrl.trainer")

QUEUE_FILE = "queue.json"


@dataclass(frozen=True)
class Pipeline:
    """The asynchronous schedule's own knobs (from `transport`, `algo` and `rollout`)."""

    group_size: int
    min_groups: int
    max_groups: int
    capacity: int
    group_timeout_s: float
    weights: str = "dir"  # dir | broadcast
    poll_s: float = 0.005


class Publisher:
    """Weights v<N> to the engines: the versioned directory always (restarts read it), plus the in-job
    broadcast when configured. The copy to CPU happens on the trainer's thread; writing the directory and
    the broadcast run on a background thread, so the next step overlaps them (it waits only if the previous
    publish is still running)."""

    def __init__(self, run_dir: Path, broadcast: Any = None, base: Path | None = None) -> None:
        self.run_dir, self.broadcast, self.base = run_dir, broadcast, base
        self.dtype = weights_io.model_dtype(base) if base is not None else None  # the model's own, as published
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.wait_s = 0.0
        self.unannounced: int | None = None  # a version published but not yet announced to the rollout ranks

    def publish(self, version: int, state: dict[str, torch.Tensor]) -> None:
        self.join()
        copy = {k: v.detach().to("cpu", dtype=self.dtype if self.dtype is not None and v.is_floating_point()
                                   else v.dtype, copy=True) for k, v in state.items()}

        def work() -> None:
            try:
                weights_io.publish(self.run_dir, version, copy, base=self.base)
                if self.broadcast is not None:
                    self.broadcast.send(version, copy.items())
            except BaseException as e:  # noqa: BLE001 - re-raised on the trainer thread by join()
                self._error = e

        self._thread = threading.Thread(target=work, name=f"publish-v{version}", daemon=True)
        self._thread.start()
        self.unannounced = version

    def announce(self, ch: Any, wait: bool = False) -> None:
        """Notify the rollout ranks of the newest version once it is complete (directory written, broadcast
        sent): a notice never names weights that are not there yet. From the trainer thread only (MPI)."""
        if self.unannounced is None:
            return
        if wait:
            self.join()
        if self._thread is None or not self._thread.is_alive():
            self.join()
            ch.notify(self.unannounced)
            self.unannounced = None

    def close(self) -> None:
        """End the broadcast with an empty message of version -1: receivers leave their loop, so no process
        exits with a collective pending (gloo aborts the process then)."""
        self.join()
        if self.broadcast is not None:
            self.broadcast.send(-1, [])

    def join(self) -> None:
        if self._thread is not None:
            t0 = time.perf_counter()
            self._thread.join()
            self.wait_s += time.perf_counter() - t0
            self._thread = None
        if self._error is not None:
            raise RuntimeError("publishing weights failed") from self._error


def save_queue(run_dir: Path, q: TrajectoryQueue) -> None:
    """The queue's ledger beside the newest checkpoint (the checkpoint itself holds `consumed` too)."""
    ckpt = checkpoint.latest(run_dir)
    if ckpt is not None:
        write_json_atomic(ckpt / QUEUE_FILE, q.state_dict())


def drain_shards(run_dir: Path, q: TrajectoryQueue) -> Counter[str]:
    """A restarted trainer: everything the rollout ranks wrote goes through the queue again; consumed and
    excluded ids come back as duplicates, held-but-untrained ones are accepted, stale ones counted stale."""
    out: Counter[str] = Counter()
    for _, d in sorted(rank_dirs(run_dir, "rollout").items()):
        for _, trajs in ShardReader(d).scan():
            out.update(q.put_many(trajs))
    return out


def run(run_dir: Path, model_dir: Path, s: Schedule, h: RLHyper, p: Pipeline, threads: int, monitor,
        channel_factory: Any, par: Parallel | None = None, broadcast_factory: Any = None,
        should_stop: Callable[[], bool] | None = None) -> TrainerState:
    """Warm start (unless resuming), then `s.steps` asynchronous steps. Every trainer rank runs it.

    Rank 0 is the hub: it alone opens the channel, holds the queue and its ledger, publishes weights and
    writes the reports. Each step it selects the training data and sends it to the other ranks over
    torch.distributed; every rank then takes the same `rl_step` on it (`par` splits the micro-batches).

    Args:
        channel_factory: `version -> TrainerChannel` (the MPI world, or a port; called once v<version> exists;
            on the hub only).
        broadcast_factory: `() -> WeightBroadcast` (sender side) when `p.weights == "broadcast"` (hub only).
        should_stop: asked after every step (preemption; the hub's answer counts): when true, the step just
            trained is checkpointed and the run ends early the way a finished run does (the rollout ranks are
            told to stop, the ledger is written), so that a restarted trainer resumes from that step.
    """
    par = par or Parallel()
    hub = par.is_main
    torch.manual_seed(s.seed)
    model = load_policy(model_dir, threads, par)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    resume = par.broadcast_object(checkpoint.latest(run_dir))  # the hub decides: every rank takes the same path
    check_control_run(s, resume)
    ws: WarmStart | None = None
    sft_done = 0
    if resume is None and s.sft_steps > 0:  # every rank: each runs its share of the same warm-start batches
        demos = ShardReader(run_dir / "shards" / "expert-0").wait(0, timeout_s=s.wait_timeout_s, poll_s=s.poll_s)
        log.info("warm start on %d expert trajectories", len(demos))
        ws = WarmStart(model, demos, s, h, pad_id, par)
        sft_done = int(ws.run(monitor)["sft_steps_done"])
        if h.kl_coef > 0:
            ref_state = par.full_state_dict(model)
            if hub:
                checkpoint.save_reference(run_dir, ref_state)
            par.barrier()
    ref_model = reference_model(run_dir, model_dir, threads, par, s.sft_steps > 0) if h.kl_coef > 0 else None
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=s.weight_decay)
    warmup = max(s.warmup_steps, 1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / warmup))
    state = TrainerState()
    state.stats["sft_steps"] = float(sft_done)
    q = TrajectoryQueue(p.group_size, p.capacity, s.max_staleness, p.group_timeout_s,
                        lagging_max_staleness=s.lagging_max_staleness)
    if resume is not None:
        state = checkpoint.load(resume, model, opt, sched, par)
        if hub:
            if (resume / QUEUE_FILE).exists():
                q.load_state_dict(json.loads((resume / QUEUE_FILE).read_text()))
            q.set_version(state.policy_version)
            discarded = weights_io.discard_newer(run_dir, state.policy_version)
            drained = drain_shards(run_dir, q)
            log.info("resumed from %s: step %d, policy v%d (weights %s discarded); drained the shards: %d held "
                     "again, %s", resume, state.step, state.policy_version, discarded or "none", q.depth,
                     dict(drained))
    if par.broadcast_object(resume is None or weights_io.latest_version(run_dir) < state.policy_version):
        publish_weights(run_dir, state.policy_version, model, par, model_dir)
    if resume is None and s.checkpoint_every:
        checkpoint.save(run_dir, state, model, opt, sched, par, s.keep_checkpoints)
        if hub:
            save_queue(run_dir, q)
    if not hub:  # the other ranks train what the hub sends them, step by step
        _follow(run_dir, model, opt, sched, ref_model, ws, state, s, h, pad_id, par)
        return state
    ch = channel_factory(state.policy_version)
    publisher = Publisher(run_dir, broadcast_factory() if p.weights == "broadcast" else None, model_dir)
    # A failure propagates as it is (under `python -m mpi4py` it aborts the world): nothing to announce then.
    _loop(run_dir, model, opt, sched, ref_model, ws, state, q, ch, publisher, s, h, p, pad_id, monitor, par,
          should_stop)
    publisher.announce(ch, wait=True)  # the last version before the stop: rollout rank 0 evaluates it
    publisher.close()
    late = ch.close(timeout_s=max(s.wait_timeout_s, 60.0))
    left = _count_left(q, late)
    state.stats.update({f"left_at_end/{k}": float(v) for k, v in left.items()})
    write_report(run_dir, state, s.steps, q)
    write_ledger(run_dir, q)
    save_queue(run_dir, q)
    log.info("pipeline closed: %s", json.dumps(_ledger(q, left)))
    return state


def _train(model: torch.nn.Module, opt: Any, ref_model: Any, ws: WarmStart | None, s: Schedule, h: RLHyper,
           pad_id: int, par: Parallel, usable: list[Trajectory], rewards: list[float]) -> dict[str, float]:
    """One step's update, the same on every rank: an imitation step (the control run), an RL step on the
    batch, or none when nothing was usable."""
    if ws is not None and s.update == "sft":
        return ws.step()
    if usable:
        model.train()
        return rl_step(model, opt, collate(usable, rewards, pad_id), h, ref_model, par)
    return {}


def _end_step(run_dir: Path, model: torch.nn.Module, opt: Any, sched: Any, state: TrainerState, s: Schedule,
              par: Parallel, publish: Callable[[dict[str, torch.Tensor]], None] | None = None,
              should_stop: Callable[[], bool] | None = None, dtype: torch.dtype | None = None) -> tuple[bool, bool]:
    """After an update, on every rank: advance the schedule and the version, hand the whole weights to
    `publish` (the hub's), agree on the hub's stop signal, checkpoint when due.

    Returns:
        (stop, checkpointed).
    """
    sched.step()
    state.step += 1
    state.policy_version += 1
    # whole on the hub only, gathered tensor by tensor in the published dtype (`dtype`, the hub's to say)
    weights = gathered_state_dict(model, par, dtype) if par.distributed else model.state_dict()
    if publish is not None:
        publish(weights)
    stop = bool(par.broadcast_object(par.is_main and should_stop is not None and should_stop()))
    due = stop or bool(s.checkpoint_every) and (state.step % s.checkpoint_every == 0 or state.step == s.steps)
    if due:
        checkpoint.save(run_dir, state, model, opt, sched, par, s.keep_checkpoints)
    return stop, due


def _follow(run_dir: Path, model: torch.nn.Module, opt: Any, sched: Any, ref_model: Any, ws: WarmStart | None,
            state: TrainerState, s: Schedule, h: RLHyper, pad_id: int, par: Parallel) -> None:
    """A trainer rank other than the hub: each step the hub's selected batch arrives over torch.distributed
    and this rank takes its share of the same update, until the steps are done or the hub says stop."""
    log.info("trainer rank %d of %d: taking its share of each step the hub selects (from step %d)", par.rank,
             par.world_size, state.step)
    while state.step < s.steps:
        usable, rewards = par.broadcast_object(None)
        _train(model, opt, ref_model, ws, s, h, pad_id, par, usable, rewards)
        if _end_step(run_dir, model, opt, sched, state, s, par)[0]:
            break
    log.info("trainer rank %d: done after step %d (policy v%d)", par.rank, state.step, state.policy_version)


def _loop(run_dir: Path, model: torch.nn.Module, opt: Any, sched: Any, ref_model: Any, ws: WarmStart | None,
          state: TrainerState, q: TrajectoryQueue, ch: Any, publisher: Publisher, s: Schedule, h: RLHyper,
          p: Pipeline, pad_id: int, monitor, par: Parallel, should_stop: Callable[[], bool] | None = None) -> None:
    """The hub's steps: receive, select, send the batch to the other ranks, train, publish, report."""
    # Idle time counts from the first batch on: the wait for it (engines starting, the first episodes) is the
    # pipeline's fill, logged apart as pipeline/fill_s.
    t_start: float | None = None
    idle_total = 0.0
    while state.step < s.steps:
        t_wait = time.perf_counter()
        groups = _next_groups(q, ch, p, s.wait_timeout_s, publisher)
        t0 = time.perf_counter()
        if t_start is None:
            t_start = t0
            state.stats["fill_s"] = t0 - t_wait
        else:
            idle_total += t0 - t_wait
        trajs = [t for g in groups for t in g]
        stale = [trajectory_staleness(t, state.policy_version) for t in trajs]
        usable, rewards, counts = select_training_data(trajs, state.policy_version, s)
        if ws is not None and s.update == "sft":  # the control run: imitation instead of RL
            counts["dropped_control"] = len(usable)  # the rollout's episodes are left out, and counted
            usable, rewards = [], []
        par.broadcast_object((usable, rewards))  # the other trainer ranks' batch (see _follow)
        stats = _train(model, opt, ref_model, ws, s, h, pad_id, par, usable, rewards)
        lr = opt.param_groups[0]["lr"]
        state.consumed.update(t.traj_id for t in trajs)
        n_tok = sum(t.num_tokens for t in usable)
        for k, v in {"trajectories_trained": len(usable), "tokens_trained": n_tok, "rl_steps": float(bool(stats)),
                     **counts}.items():
            if k != "staleness_max":
                state.stats[k] = state.stats.get(k, 0.0) + float(v)

        def publish(weights: dict[str, torch.Tensor]) -> None:
            write_report(run_dir, state, s.steps, q)
            publisher.publish(state.policy_version, weights)
            q.set_version(state.policy_version)

        stop, checkpointed = _end_step(run_dir, model, opt, sched, state, s, par, publish, should_stop,
                                       publisher.dtype)
        if checkpointed:
            save_queue(run_dir, q)
        dt = time.perf_counter() - t0
        wall = time.perf_counter() - t_start
        metrics = {f"train/{k}": v for k, v in stats.items()}
        metrics.update(q.metrics())
        metrics.update({"train/lr": lr, "pipeline/batch_size": float(len(usable)),
                        "pipeline/groups": float(len(groups)), "pipeline/trainer_wait_s": t0 - t_wait,
                        "pipeline/trainer_idle_frac": idle_total / max(wall, 1e-9),
                        "pipeline/staleness_mean": sum(stale) / max(len(stale), 1),
                        "pipeline/staleness_max": float(max(stale, default=0)),
                        "pipeline/train_tokens_per_s": n_tok / max(dt, 1e-9),
                        "pipeline/publish_wait_s": publisher.wait_s})
        metrics.update({f"pipeline/{k}": float(v) for k, v in counts.items() if k != "staleness_max"})
        for k, v in Counter(stale).items():
            metrics[f"pipeline/staleness_hist/{k}"] = float(v)
        state.stats["idle_s"] = idle_total
        state.stats["rl_wall_s"] = wall
        state.stats["staleness_sum"] = state.stats.get("staleness_sum", 0.0) + sum(stale)
        state.stats["staleness_max"] = max(state.stats.get("staleness_max", 0.0), float(max(stale, default=0)))
        monitor.scalars(metrics, state.step - 1)
        log.info("step %d/%d trained on %d of %d (%d groups; staleness mean %.2f max %d; queue %d) loss %.6f "
                 "(%.2fs, waited %.2fs)", state.step, s.steps, len(usable), len(trajs), len(groups),
                 metrics["pipeline/staleness_mean"], int(metrics["pipeline/staleness_max"]), q.depth,
                 stats.get("loss", 0.0), dt, t0 - t_wait)
        if stop:
            log.info("preempted: checkpointed step %d (policy v%d, %d trajectories consumed); stopping the rollout "
                     "ranks", state.step, state.policy_version, len(state.consumed))
            break


def _next_groups(q: TrajectoryQueue, ch: Any, p: Pipeline, timeout_s: float, publisher: Publisher
                 ) -> list[list[Trajectory]]:
    """Receive while the queue has room until at least `min_groups` complete groups are ready (and announce
    the last published version as soon as it is complete)."""
    deadline = time.monotonic() + timeout_s
    while True:
        publisher.announce(ch)
        if not q.full:
            for _, batch in ch.poll():
                q.put_many(batch)
        groups = q.take(p.min_groups, p.max_groups)
        if groups:
            return groups
        if time.monotonic() > deadline:
            raise TimeoutError(f"trainer: fewer than {p.min_groups} complete groups for {timeout_s:g}s "
                               f"(queue {q.depth}, open rollout ranks {ch.open_ranks})")
        time.sleep(p.poll_s)


def _count_left(q: TrajectoryQueue, late: list[Trajectory]) -> Counter[str]:
    """Trajectories produced but not trained when the run ended: held in the queue, or arriving after."""
    left: Counter[str] = Counter()
    held = q.depth
    excluded = q.put_many(late)
    left["held"] = held + len(late) - sum(excluded.values())
    left.update({f"late_{k}": v for k, v in excluded.items()})
    return left


def _ledger(q: TrajectoryQueue, left: Counter[str]) -> dict[str, Any]:
    return {"consumed": q.counts["consumed"], "excluded": {k: v for k, v in q.counts.items()
                                                          if k not in ("accepted", "consumed")},
            "left_at_end": dict(left)}


def write_ledger(run_dir: Path, q: TrajectoryQueue) -> None:
    """report/ledger.json: every trajectory id the trainer saw, by fate (consumed, excluded by reason, held
    when the run ended), so the shards can be reconciled against it: nothing lost silently, nothing twice."""
    state = q.state_dict()
    body = {"consumed": state["consumed"], "excluded": state["excluded"], "held_at_end": sorted(q.held_ids())}
    write_json_atomic(run_dir / "report" / "ledger.json", body)


def write_report(run_dir: Path, state: TrainerState, steps: int, q: TrajectoryQueue) -> None:
    """report/trainer.json (as the synchronous role's) plus the queue's ledger counts."""
    from agentrl.trainer.role import write_report as write_sync_report

    write_sync_report(run_dir, state, steps)
    path = run_dir / "report" / "trainer.json"
    body = json.loads(path.read_text())
    body["schedule"] = "async"
    body["queue"] = {k: int(v) for k, v in q.counts.items()}
    write_json_atomic(path, body, indent=2)
