"""A run's Slurm layout as plain data: which groups (het groups, or jobs) it asks for and which steps run
in each. The sbatch renderer (`sbatch.py`) and the submitit front end (`submit.py`) both read this, so
what a person submits by hand and what Python submits are the same steps.

Groups, in het-group order: 0 trainer, 1 rollout, 2 env workers (+ the controller by default). Each step
runs `python -m agentrl.launch.slurm_env --het-group N -- python -m jobs.<role>`, so every role's rank
variables come from one reader of Slurm's. Not here: MPI between the roles. The roles do not use MPI
yet (the transport is HDF5 shards in the run dir), so each role is its own srun step; once the MPI
transport is wired, trainer and rollout become one MPMD step (`srun --mpi=pmi2 --het-group=0 ... :
--het-group=1 ...`, which `tests/launch/test_slurm_cluster.py` shows working across groups).

Standard library only (plus agentrl.config): this runs on login nodes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from agentrl.config import RunConfig, SlurmGroupConfig

TRAINER, ROLLOUT, ENV = 0, 1, 2
GROUP_NAMES = ("trainer", "rollout", "env")


@dataclass(frozen=True)
class Group:
    name: str
    directives: tuple[tuple[str, str], ...]
    """`#SBATCH --key=value` pairs in a fixed order (a readable script; stable golden files)."""


@dataclass(frozen=True)
class Step:
    role: str
    group: int
    ntasks: int
    module: str
    args: tuple[str, ...] = ()
    overlap: bool = False
    """Shares its group's CPUs with another step (the controller beside the trainer)."""
    ends_run: bool = False
    """The run is over when every ends_run step has exited; the others are then stopped."""
    gpus_per_task: int = 0
    """Bind this many GPUs to each task (rollout ranks: their engines' GPUs, so two ranks never share
    one). 0 for the trainer: its ranks see the node's GPUs and pick `cuda:LOCAL_RANK`."""


@dataclass(frozen=True)
class Plan:
    name: str
    groups: tuple[Group, ...]
    steps: tuple[Step, ...]
    needs_model: bool
    """No model.path: the run builds its tiny model (jobs.make_model) before the roles start."""
    signal_s: int
    python: str
    overrides: tuple[str, ...] = field(default=())
    """Overrides the job adds to the preset's (the controller must listen beyond loopback)."""


def _directives(slurm: SlurmGroupConfig, nodes: int, ntasks_per_node: int | None, ntasks: int | None,
                gpus_per_node: int) -> tuple[tuple[str, str], ...]:
    d: list[tuple[str, str]] = []
    for key in ("partition", "account", "qos"):
        if getattr(slurm, key):
            d.append((key, getattr(slurm, key)))
    d.append(("time", slurm.time))
    d.append(("nodes", str(nodes)))
    if ntasks_per_node is not None:
        d.append(("ntasks-per-node", str(ntasks_per_node)))
    if ntasks is not None:
        d.append(("ntasks", str(ntasks)))
    d.append(("cpus-per-task", str(slurm.cpus_per_task)))
    if gpus_per_node:
        d.append(("gpus-per-node", str(gpus_per_node)))
    if slurm.mem:
        d.append(("mem", slurm.mem))
    if slurm.constraint:
        d.append(("constraint", slurm.constraint))
    return tuple(d)


def plan(cfg: RunConfig) -> Plan:
    """The groups and steps of `cfg`'s run."""
    c = cfg.cluster
    controller_group = ENV if c.controller_placement == "env" else TRAINER
    env_tasks = cfg.envs.workers + (1 if controller_group == ENV else 0)
    groups = (
        Group("trainer", _directives(c.trainer.slurm, c.trainer.nodes, c.trainer.ranks_per_node, None,
                                     c.trainer.gpus_per_node)),
        Group("rollout", _directives(c.rollout.slurm, c.rollout.nodes, c.rollout.ranks // c.rollout.nodes, None,
                                     c.rollout.gpus_per_node)),
        Group("env", _directives(c.env.slurm, c.env.nodes, None, env_tasks, 0)),
    )
    steps = (
        Step("controller", controller_group, 1, "jobs.controller", overlap=controller_group == TRAINER),
        Step("env_worker", ENV, cfg.envs.workers, "jobs.env_worker"),
        Step("rollout", ROLLOUT, c.rollout.ranks, "jobs.rollout", ends_run=True,
             gpus_per_task=c.rollout.gpus_per_rank if c.rollout.gpus_per_node else 0),
        Step("trainer", TRAINER, c.trainer.world_size, "jobs.trainer", ends_run=True),
    )
    return Plan(name=cfg.name, groups=groups, steps=steps, needs_model=not cfg.model.path, signal_s=c.signal_s,
                python=c.python, overrides=("controller.host=0.0.0.0",))
