"""`RunConfig`, the whole tree: its sections, the checks across them, and the pipeline's numbers derived from them
(`PipelineShape`)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from agentrl.config.cluster import ClusterConfig
from agentrl.config.errors import _check
from agentrl.config.model import ModelConfig
from agentrl.config.sections import (
    AlgoConfig,
    ControllerConfig,
    EnvsConfig,
    MonitorConfig,
    RolloutConfig,
    TrainerConfig,
    TransportConfig,
)
from agentrl.config.task_options import checked_task_options


@dataclass(frozen=True)
class PipelineShape:
    """The pipeline's derived numbers, worked out in one place (`RunConfig.pipeline`) from `rollout`, `algo`,
    `transport` and `cluster`: what the trainer's queue, its steps and each rollout rank's admission use.

    The synchronous schedule is this pipeline with `max_staleness` 0, `inflight` drain and exactly one step's
    groups per step: the rollout rank starts a step's groups on v<N>, the trainer takes all of them, trains
    once and publishes v<N+1>, and only then does the next step's sampling start."""

    group_size: int
    min_groups: int
    """Complete groups a step waits for (transport.min_groups; 0 there: one step's worth)."""
    max_groups: int
    capacity: int
    """Trajectories the trainer's queue holds before it stops receiving."""
    max_staleness: int
    lagging_max_staleness: int
    """How old a lagging-pool token may be when trained on. A lagging engine reloads once the current engine is
    K = lagging_refresh_steps versions ahead, so it samples at most K - 1 versions behind; the trainer may then
    be up to max_staleness versions further on (one version of slack)."""
    inflight: str
    group_timeout_s: float
    steps: int


@dataclass(frozen=True)
class RunConfig:
    name: str = "demo"
    run_root: str = "runs"
    seed: int = 0
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    envs: EnvsConfig = field(default_factory=EnvsConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.run_root) / self.name

    @property
    def pipeline(self) -> PipelineShape:
        """The pipeline's derived numbers (see `PipelineShape`); the synchronous schedule's are fixed."""
        r, t, a, pool = self.rollout, self.transport, self.algo, self.cluster.rollout
        step_groups = r.groups_per_task * len(self.envs.tasks)
        sync = self.cluster.schedule == "sync"
        min_groups = step_groups if sync else t.min_groups or step_groups
        max_groups = min_groups if sync else t.max_groups or min_groups
        staleness = 0 if sync else a.max_staleness
        return PipelineShape(
            group_size=r.group_size, min_groups=min_groups, max_groups=max_groups,
            capacity=t.queue_capacity or 4 * max_groups * r.group_size, max_staleness=staleness,
            lagging_max_staleness=staleness + (pool.lagging_refresh_steps if pool.lagging_engines_per_rank else 0),
            inflight="drain" if sync else t.inflight, group_timeout_s=t.group_timeout_s, steps=self.trainer.steps)

    def validate(self, p: str = "") -> None:
        _check(bool(self.name) and "/" not in self.name and self.name not in (".", ".."), "name",
               "must be a non-empty name without '/'")
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if dataclasses.is_dataclass(v):
                v.validate(f.name)
        # each task's options against the dataclass it declares, its time limits within the message budget
        checked_task_options(self.envs, self.controller)
        # fields that only make sense together
        _check(self.trainer.warm_start_steps == 0 or self.rollout.expert_samples > 0, "rollout.expert_samples",
               "must be > 0 when trainer.warm_start_steps > 0 (the warm start trains on the expert's episodes)")
        _check(self.trainer.update == "rl" or self.trainer.warm_start_steps > 0, "trainer.update",
               "warm_start (the control run) continues the warm start: it needs trainer.warm_start_steps > 0")
        _check(self.trainer.steps == 0 or self.rollout.group_size >= 2, "rollout.group_size",
               "must be >= 2 for RL: group advantages of a group of one are 0")
        _check(self.rollout.lagging_prob == 0.0 or self.cluster.rollout.lagging_engines_per_rank >= 1,
               "rollout.lagging_prob", f"is {self.rollout.lagging_prob} but cluster.rollout.lagging_engines_per_rank "
               "is 0: no lagging engine to route turns to")
        _check(self.envs.workers >= self.cluster.env.nodes, "envs.workers",
               f"must be >= cluster.env.nodes ({self.cluster.env.nodes}): every env node runs a worker")
        _check(bool(self.model.path) or self.rollout.max_model_len <= self.model.max_position,
               "rollout.max_model_len", "must be <= model.max_position")
        # the baseline's numbers are fixed (`RunConfig.pipeline`: max_staleness 0 and drain whatever algo and transport
        # say, so that `cluster.schedule=sync` on any preset is its baseline); a batch size of its own contradicts it
        if self.cluster.schedule == "sync":
            _check(self.transport.min_groups == 0 and self.transport.max_groups == 0, "transport.min_groups",
                   "min_groups and max_groups must be 0 with cluster.schedule=sync (each step takes one step's "
                   "groups: rollout.groups_per_task x tasks)")
        shape = self.pipeline
        _check(shape.capacity >= shape.min_groups * shape.group_size, "transport.queue_capacity",
               f"must be 0 or >= min_groups x rollout.group_size ({shape.min_groups * shape.group_size}): "
               "a full queue must hold a batch, or the trainer stops receiving with none to take")
        # Trainer and rollout ranks start, stop and requeue together: one MPMD srun step across het groups (MPI
        # channel), or steps of the same job (file channel). Jobs of their own (cluster.hetjob=false) need the
        # file channel, whose rollout ranks follow a requeued trainer by starting again.
        _check(self.cluster.hetjob or self.transport.channel == "files", "cluster.hetjob",
               "false (one job per role) needs transport.channel=files: an MPI world cannot span separate jobs")
        trainer_ranks = self.cluster.trainer.world_size
        if trainer_ranks > 1:
            # Data-parallel trainer ranks meet through the MPMD world (ranks and rendezvous from MPI), or with the
            # file channel as one srun step of T tasks (ranks from Slurm through `launch.slurm_env`); the local
            # launcher starts one file-channel trainer process (jobs.train says so).
            _check(self.trainer.parallel != "none", "trainer.parallel",
                   f"must be ddp or fsdp2 with {trainer_ranks} trainer ranks (cluster.trainer nodes x ranks_per_node)")
