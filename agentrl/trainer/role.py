"""The trainer role (docs/architecture.md §6, docs/pipeline.md): trajectories arrive from the rollout ranks while
the trainer trains; every step takes the complete GRPO groups available (`min_groups`..`max_groups` of
`RunConfig.pipeline`), trains once, publishes v<N+1> and tells the rollout ranks.

    learner (warm start unless resuming) → publish v0
    loop: receive (while the queue has room) → take groups → select → update → publish v<N+1> → notify
    close the channel: rollout ranks stop; what arrives after the last step is counted `left_at_end`

The synchronous baseline (`cluster.schedule=sync`) is this loop with its numbers fixed: max_staleness 0 and
exactly one step's groups per step, so the rollout rank samples a step on v<N> while the trainer waits, and
the trainer trains while the rollout rank waits for v<N+1>.

With several (data-parallel) trainer ranks, rank 0 is the hub: it alone talks to the rollout ranks, keeps the
queue and publishes; each step it sends the batch it selected to the other ranks (`torch.distributed`), and
every rank takes its share of the update. The queue (`TrajectoryQueue`) holds the exactly-once ledger; it is
saved beside each checkpoint (`queue.json`), and a restarted trainer drains the rollout shards into it, so
nothing consumed is trained twice and nothing produced is lost silently.
"""
from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.config import PipelineShape, RunConfig
from agentrl.fsio import write_json_atomic
from agentrl.trainer import checkpoint
from agentrl.trainer.checkpoint import TrainerState
from agentrl.trainer.learner import Learner
from agentrl.trainer.parallel import Parallel
from agentrl.trainer.publisher import Publisher
from agentrl.trainer.select import select_training_data
from agentrl.trainer.step_report import StepReport
from agentrl.transport import weights as weights_io
from agentrl.transport.channel import TrainerChannel
from agentrl.transport.queue import TrajectoryQueue
from agentrl.transport.shards import ShardReader, rank_dirs
from agentrl.types import Trajectory

log = logging.getLogger("agentrl.trainer")

QUEUE_FILE = "queue.json"
KEEPALIVE = "keepalive"
"""What the hub sends the other trainer ranks while it waits for groups (every quarter of the collective
timeout): they wait in a collective, which would otherwise time out during a long fill (engines starting,
the first evaluation) although nothing is wrong; a real hang still ends within the timeout."""


def save_queue(run_dir: Path, q: TrajectoryQueue) -> None:
    """The queue's ledger at the end of the run, over the one the newest checkpoint was written with (every
    checkpoint carries its own: `Learner.checkpoint_extra`); what arrived late is in it."""
    ckpt = checkpoint.latest(run_dir)
    if ckpt is not None:
        write_json_atomic(ckpt / QUEUE_FILE, q.state_dict())


def restore_queue(ckpt: Path, state: TrainerState, q: TrajectoryQueue) -> None:
    """The queue's ledger as of checkpoint `ckpt`. A checkpoint without one (written before checkpoints
    carried it) still names the consumed ids: those come back as consumed, so that the drain does not take
    them again; their exclusions are lost (the drain counts them anew)."""
    path = ckpt / QUEUE_FILE
    if path.exists():
        q.load_state_dict(json.loads(path.read_text()))
        return
    log.warning("%s has no %s: restoring the %d consumed ids of its trainer state", ckpt, QUEUE_FILE,
                len(state.consumed))
    q.mark_consumed(state.consumed)


def drain_shards(run_dir: Path, q: TrajectoryQueue) -> Counter[str]:
    """A restarted trainer: everything the rollout ranks wrote goes through the queue again; consumed and
    excluded ids come back as duplicates, held-but-untrained ones are accepted, stale ones counted stale."""
    out: Counter[str] = Counter()
    for _, d in sorted(rank_dirs(run_dir, "rollout").items()):
        for _, trajs in ShardReader(d).scan():
            out.update(q.put_many(trajs))
    return out


def run(run_dir: Path, model_dir: Path, cfg: RunConfig, monitor, channel_factory: Callable[[int], TrainerChannel],
        par: Parallel | None = None, broadcast_factory: Callable[[], Any] | None = None,
        should_stop: Callable[[], bool] | None = None) -> TrainerState:
    """Warm start (unless resuming), then `trainer.steps` steps. Every trainer rank runs it.

    Rank 0 is the hub: it alone opens the channel, holds the queue and its ledger, publishes weights and
    writes the reports. Each step it selects the training data and sends it to the other ranks over
    torch.distributed; every rank then takes the same update on it (`par` splits the micro-batches).

    Args:
        channel_factory: `version -> TrainerChannel` (the MPI world, or the file channel; called once v<version>
            exists; on the hub only).
        broadcast_factory: `() -> WeightBroadcast` (sender side) when `transport.weights == "broadcast"` (hub).
        should_stop: asked after every step (preemption; the hub's answer counts): when true, the step just
            trained is checkpointed and the run ends early the way a finished run does (the rollout ranks are
            told to stop, the ledger is written), so that a restarted trainer resumes from that step.
    """
    par = par or Parallel()
    hub = par.is_main
    shape = cfg.pipeline
    learner = Learner(run_dir, model_dir, cfg, monitor, par)
    state = learner.state
    q = TrajectoryQueue(shape.group_size, shape.capacity, shape.max_staleness, shape.group_timeout_s,
                        lagging_max_staleness=shape.lagging_max_staleness)
    learner.checkpoint_extra = lambda: {QUEUE_FILE: q.state_dict()}  # in place exactly when the checkpoint is
    if learner.resume is not None:
        log.info("resumed from %s: step %d, policy v%d, %d trajectories consumed", learner.resume, state.step,
                 state.policy_version, len(state.consumed))
        if hub:
            restore_queue(learner.resume, state, q)
            q.set_version(state.policy_version)
            discarded = weights_io.discard_newer(run_dir, state.policy_version)
            drained = drain_shards(run_dir, q)
            log.info("weights %s discarded; drained the shards: %d held again, %s", discarded or "none", q.depth,
                     dict(drained))
    if par.broadcast_object(learner.resume is None or weights_io.latest_version(run_dir) < state.policy_version):
        learner.publish_current()
    if learner.resume is None and cfg.trainer.checkpoint_every:  # a restart from here skips the warm start
        learner.save()
    if not hub:  # the other ranks train what the hub sends them, step by step
        _follow(learner)
        return state
    ch = channel_factory(state.policy_version)
    publisher = Publisher(run_dir, broadcast_factory() if cfg.transport.weights == "broadcast" else None, model_dir,
                          learner.chat_template)
    # A failure propagates as it is (under `python -m mpi4py` it aborts the world): nothing to announce then.
    _loop(run_dir, learner, q, ch, publisher, cfg, shape, monitor, should_stop)
    publisher.announce(ch, wait=True)  # the last version before the stop: rollout rank 0 evaluates it
    publisher.close()
    late = ch.close(timeout_s=max(cfg.cluster.role_timeout_s, 60.0))  # warns, naming ranks that did not close
    left = _count_left(q, late)
    state.stats.update({f"left_at_end/{k}": float(v) for k, v in left.items()})
    state.stats["ranks_not_closed"] = float(len(ch.open_ranks))
    write_report(run_dir, state, shape.steps, q, cfg.cluster.schedule)
    write_ledger(run_dir, q)
    save_queue(run_dir, q)
    log.info("pipeline closed: %s", json.dumps(_ledger(q, left)))
    return state


def _follow(learner: Learner) -> None:
    """A trainer rank other than the hub: each step the hub's selected batch arrives over torch.distributed
    and this rank takes its share of the same update, until the steps are done or the hub says stop."""
    par, state = learner.par, learner.state
    log.info("trainer rank %d of %d: taking its share of each step the hub selects (from step %d)", par.rank,
             par.world_size, state.step)
    while state.step < learner.t.steps:
        msg = par.broadcast_object(None)
        if msg == KEEPALIVE:
            continue
        usable, rewards = msg
        learner.update(usable, rewards)
        if learner.end_step():
            break
    log.info("trainer rank %d: done after step %d (policy v%d)", par.rank, state.step, state.policy_version)


def _loop(run_dir: Path, learner: Learner, q: TrajectoryQueue, ch: TrainerChannel, publisher: Publisher, cfg: RunConfig,
          shape: PipelineShape, monitor, should_stop: Callable[[], bool] | None = None) -> None:
    """The hub's steps: receive, select, send the batch to the other ranks, train, publish, report."""
    state, par, a = learner.state, learner.par, cfg.algo
    report = StepReport(state, q, publisher, monitor, shape.steps)
    keepalive = (lambda: par.broadcast_object(KEEPALIVE)) if par.distributed else None
    keepalive_s = cfg.cluster.trainer.collective_timeout / 4
    while state.step < shape.steps:
        report.waiting()
        groups = (_no_groups(q, ch, publisher) if learner.control else
                  _next_groups(q, ch, shape, cfg.cluster.role_timeout_s, cfg.transport.poll_s, publisher, keepalive,
                               keepalive_s))
        report.got(groups, state.policy_version)
        trajs = [t for g in groups for t in g]
        usable, rewards, counts = select_training_data(trajs, state.policy_version, shape.max_staleness,
                                                       shape.lagging_max_staleness, a.fail_penalty,
                                                       a.drop_uniform_groups)
        if learner.control:  # imitation instead of RL: an episode that reached it anyway is left out, and counted
            counts["dropped_control"] = len(usable)
            usable, rewards = [], []
        par.broadcast_object((usable, rewards))  # the other trainer ranks' batch (see _follow)
        lr = learner.lr  # the rate this step uses
        stats = learner.update(usable, rewards)
        state.consumed.update(t.traj_id for t in trajs)
        report.trained(usable, counts, stats, lr)

        def publish(weights: dict[str, Any]) -> None:
            # the report before the weights: a rollout that sees v<N> finds the report of step N
            write_report(run_dir, state, shape.steps, q, cfg.cluster.schedule)
            publisher.publish(state.policy_version, weights)
            q.set_version(state.policy_version)

        stop = learner.end_step(publish, should_stop)  # a checkpoint carries the queue's ledger
        report.done(learner.control)
        if stop:
            log.info("preempted: checkpointed step %d (policy v%d, %d trajectories consumed); stopping the rollout "
                     "ranks", state.step, state.policy_version, len(state.consumed))
            break


def _next_groups(q: TrajectoryQueue, ch: TrainerChannel, shape: PipelineShape, timeout_s: float, poll_s: float,
                 publisher: Publisher, keepalive: Callable[[], Any] | None = None, keepalive_s: float = 0.0
                 ) -> list[list[Trajectory]]:
    """Receive while the queue has room until at least `min_groups` complete groups are ready (and announce
    the last published version as soon as it is complete); `keepalive` every `keepalive_s` meanwhile."""
    deadline = time.monotonic() + timeout_s
    beat = time.monotonic() + keepalive_s
    while True:
        if keepalive is not None and time.monotonic() >= beat:
            keepalive()
            beat = time.monotonic() + keepalive_s
        publisher.announce(ch)
        if not q.full:
            for _, batch in ch.poll():
                q.put_many(batch)
        groups = q.take(shape.min_groups, shape.max_groups)
        if groups:
            return groups
        if time.monotonic() > deadline:
            raise TimeoutError(f"trainer: fewer than {shape.min_groups} complete groups for {timeout_s:g}s "
                               f"(queue {q.depth}, open rollout ranks {ch.open_ranks})")
        time.sleep(poll_s)


def _no_groups(q: TrajectoryQueue, ch: TrainerChannel, publisher: Publisher) -> list[list[Trajectory]]:
    """A control run's step waits for nothing: its rollout ranks play no training episode (`RolloutSpec.train`),
    so its steps cost what the imitation updates cost. The channel is still read and the last version announced."""
    publisher.announce(ch)
    for _, batch in ch.poll():
        q.put_many(batch)
    return []


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


def write_report(run_dir: Path, state: TrainerState, steps: int, q: TrajectoryQueue, schedule: str) -> None:
    """report/trainer.json: the running totals (`rl_steps` = steps whose batch updated the weights) and the
    queue's ledger counts."""
    totals = {k: (int(v) if float(v).is_integer() else v) for k, v in sorted(state.stats.items())}
    body = {"steps_done": state.step, "steps": steps, "policy_version": state.policy_version, **totals}
    body.setdefault("rl_steps", 0)
    body["schedule"] = schedule
    body["queue"] = {k: int(v) for k, v in q.counts.items()}
    write_json_atomic(run_dir / "report" / "trainer.json", body, indent=2)
