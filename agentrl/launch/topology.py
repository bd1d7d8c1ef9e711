"""A run's Slurm layout as plain data: which groups (het groups, or jobs) it asks for and which steps run
in each. The sbatch renderer (`sbatch.py`) and the submitit front end (`submit.py`) both read this, so
what a person submits by hand and what Python submits are the same steps.

Groups, in het-group order: 0 trainer, 1 rollout, 2 env workers (+ the controller by default). Each step
runs `python -m agentrl.launch.slurm_env --het-group N -- python -m jobs.<role>`, so every role's rank
variables come from one reader of Slurm's.

Trainer and rollout ranks (on either schedule: the synchronous one is the same pipeline) are one MPI world:
one MPMD step across het groups 0 and 1 (`srun --mpi=pmi2 --het-group=0 ... : --het-group=1 ...`), whose programs run
under `python -m mpi4py` and take their ranks from MPI (the trainer's T ranks are world ranks 0..T-1, its
hub rank 0; rollout rank r is world rank T + r); when that step fails it is started again, at most
`cluster.max_restarts` times. They skip the slurm_env wrapper: in a step that spans
some of the job's groups, Slurm's variables do not say where one component's tasks start. With
`transport.channel: files` there is no MPI world: the trainer (its T ranks one step, through the slurm_env
wrapper) and each rollout rank are steps of their own, every rollout rank restartable alone.

Every step carries what srun needs to place it on a real cluster: its group's `--cpus-per-task` (srun
22.05-23.02 does not inherit sbatch's), its GPUs and their binding (`cluster.gpu_binding`), its MPI plugin
(`cluster.mpi` for MPI programs, none for the rest) and the site's set-up lines (`cluster.setup`). The
config's relative paths are resolved against the repository root at render time (`path_overrides`).

Standard library only (plus agentrl.config): this runs on login nodes.
"""
from __future__ import annotations

import posixpath
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
    """GPUs of each task (a trainer rank: 1; a rollout rank: its engines'); 0: none."""
    gpu_binding: str = "gpus-per-task"
    """`cluster.gpu_binding`: gpus-per-task (`--gpus-per-task`, `--gpu-bind=per_task`) or gres (`--gres`)."""
    gpu_mask: bool = False
    """gres binding only: bind each task to disjoint GPUs (`--gpu-bind=mask_gpu:...`; the rollout ranks). The
    trainer's tasks are left to see their node's GPUs and take cuda:LOCAL_RANK."""
    tasks_per_node: int = 1
    """Tasks of this step on one node (for the gres count and the masks)."""
    cpus_per_task: int = 0
    """srun's `--cpus-per-task` (the group's; 0: none rendered)."""
    mpi_plugin: str = "none"
    """srun's `--mpi=`: `cluster.mpi` for MPI programs, none for every other step."""
    setup: bool = False
    """Run the program through the run dir's setup.sh (`cluster.setup`, on the step's node)."""
    mpi: bool = False
    """An MPI program: started as `python -m mpi4py -m <module>` (an uncaught exception aborts the whole
    MPI world instead of leaving the other ranks waiting), without the slurm_env wrapper."""
    env: tuple[tuple[str, str], ...] = ()
    """Variables set for this step's tasks (`env K=V` before the program)."""
    mpmd: tuple[Step, ...] = ()
    """Further components of the same srun step (after `:`), each in its own het group: one MPI world."""
    restarts: int = 0
    """> 0: every task is its own srun step, started again when it fails, at most this many times (the run
    goes on meanwhile). `task_args` tell the tasks apart."""
    task_args: tuple[str, ...] = ()
    """Arguments of one task of a restartable step; `{task}` stands for its index."""
    step_restarts: int = 0
    """> 0 (the MPMD step): when the whole step fails and the job was not preempted, its rendezvous keys are
    cleared and it is started again, at most this many times (the trainer resumes from its newest checkpoint,
    the rollout ranks start a new incarnation), as the local launcher restarts its `pipeline`."""


@dataclass(frozen=True)
class JobLayout:
    name: str
    groups: tuple[Group, ...]
    steps: tuple[Step, ...]
    needs_model: bool
    """No model.path: the run builds its tiny model (jobs.make_model) before the roles start."""
    signal_s: int
    python: str
    overrides: tuple[str, ...] = field(default=())
    """Overrides the job adds to the preset's (the controller must listen beyond loopback; the config's relative
    paths made absolute)."""
    root: str = "$SLURM_SUBMIT_DIR"
    """Where the job runs (`cd`) and what relative paths were resolved against: the repository root on the
    compute nodes, or the shell's $SLURM_SUBMIT_DIR (then the job must be submitted from the repository root)."""
    run_root: str = "$SLURM_SUBMIT_DIR/runs"
    """The run directories' parent (`run_root` resolved against `root`)."""
    setup: tuple[str, ...] = ()
    """`cluster.setup`: shell lines the job runs first, and every step before its program."""


def absolute(path: str, root: str) -> str:
    """`path` against `root` (a directory, or a shell expression such as $SLURM_SUBMIT_DIR); paths that are
    absolute, or start with a variable or ~, are left as they are."""
    if not path or path.startswith(("/", "$", "~")):
        return path
    return posixpath.normpath(posixpath.join(root, path))


def path_overrides(cfg: RunConfig, root: str) -> tuple[str, ...]:
    """Overrides that make the config's relative paths absolute against `root` (model, images, binds): the
    job's config.yaml then names the same files whatever directory a role starts in."""
    out: list[str] = []
    if cfg.model.path and absolute(cfg.model.path, root) != cfg.model.path:
        out.append(f"model.path={absolute(cfg.model.path, root)}")
    env = cfg.cluster.env
    for name in ("apptainer_image", "os_sandbox_image"):
        value = getattr(env, name)
        if value and absolute(value, root) != value:
            out.append(f"cluster.env.{name}={absolute(value, root)}")
    binds = tuple(absolute(b, root) for b in env.binds)
    if binds != env.binds:
        out.append("cluster.env.binds=[" + ",".join(binds) + "]")
    return tuple(out)


def _directives(slurm: SlurmGroupConfig, nodes: int, ntasks_per_node: int | None, ntasks: int | None,
                gpus_per_node: int, gpu_binding: str = "gpus-per-task") -> tuple[tuple[str, str], ...]:
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
        d.append(("gres", f"gpu:{gpus_per_node}") if gpu_binding == "gres" else ("gpus-per-node", str(gpus_per_node)))
    if slurm.mem:
        d.append(("mem", slurm.mem))
    if slurm.mem_per_gpu:
        d.append(("mem-per-gpu", slurm.mem_per_gpu))
    if slurm.constraint:
        d.append(("constraint", slurm.constraint))
    return tuple(d)


def plan(cfg: RunConfig, root: str = "$SLURM_SUBMIT_DIR") -> JobLayout:
    """The groups and steps of `cfg`'s run; the job runs in `root` (see `JobLayout.root`)."""
    c = cfg.cluster
    controller_group = ENV if c.controller_placement == "env" else TRAINER
    env_tasks = cfg.envs.workers + (1 if controller_group == ENV else 0)
    binding = c.gpu_binding
    groups = (
        Group("trainer", _directives(c.trainer.slurm, c.trainer.nodes, c.trainer.ranks_per_node, None,
                                     c.trainer.gpus_per_node, binding)),
        Group("rollout", _directives(c.rollout.slurm, c.rollout.nodes, c.rollout.ranks // c.rollout.nodes, None,
                                     c.rollout.gpus_per_node, binding)),
        Group("env", _directives(c.env.slurm, c.env.nodes, None, env_tasks, 0)),
    )
    setup = bool(c.setup)
    # every step: its group's CPUs per task, no MPI plugin unless it is an MPI program, the site's set-up
    env_step = dict(cpus_per_task=c.env.slurm.cpus_per_task, setup=setup)
    rollout_gpus = c.rollout.gpus_per_rank if c.rollout.gpus_per_node else 0
    rollout_step = dict(cpus_per_task=c.rollout.slurm.cpus_per_task, setup=setup, gpus_per_task=rollout_gpus,
                        gpu_binding=binding, gpu_mask=True, tasks_per_node=c.rollout.ranks // c.rollout.nodes)
    trainer_gpus = 1 if c.trainer.gpus_per_node else 0
    # NCCL: a failed or timed-out collective ends the process (srun then ends the step) instead of hanging it
    nccl = (("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),) if trainer_gpus else ()
    trainer_step = dict(cpus_per_task=c.trainer.slurm.cpus_per_task, setup=setup, gpus_per_task=trainer_gpus,
                        gpu_binding=binding, tasks_per_node=c.trainer.ranks_per_node, env=nccl)
    controller_cpus = (c.env if controller_group == ENV else c.trainer).slurm.cpus_per_task
    services = (
        Step("controller", controller_group, 1, "jobs.controller", overlap=controller_group == TRAINER,
             cpus_per_task=controller_cpus, setup=setup),
        Step("env_worker", ENV, cfg.envs.workers, "jobs.env_worker", restarts=c.max_restarts,
             task_args=("--worker-id", "worker-{task}"), **env_step),
    )
    threads = (("OMP_NUM_THREADS", str(c.engine_threads)),)
    if cfg.transport.channel == "files":
        # no MPI: the trainer and every rollout rank are steps of their own; a rollout rank that fails is
        # started again alone (it resumes through the file channel, as under the local launcher)
        rollout = Step("rollout", ROLLOUT, c.rollout.ranks, "jobs.rollout", ends_run=True, env=threads,
                       restarts=c.max_restarts, task_args=("--rank", "{task}"), **rollout_step)
        steps = (*services, rollout, Step("trainer", TRAINER, c.trainer.world_size, "jobs.trainer", ends_run=True,
                                          **trainer_step))
    else:  # one MPI world: the trainer's ranks (its hub is world rank 0), then the rollout's
        rollout = Step("rollout", ROLLOUT, c.rollout.ranks, "jobs.rollout", mpi=True, env=threads,
                       mpi_plugin=c.mpi, **rollout_step)
        steps = (*services, Step("trainer", TRAINER, c.trainer.world_size, "jobs.trainer", ends_run=True,
                                 mpi=True, mpmd=(rollout,), step_restarts=c.max_restarts, mpi_plugin=c.mpi,
                                 **trainer_step))
    python = absolute(c.python, root) if "/" in c.python else c.python
    return JobLayout(name=cfg.name, groups=groups, steps=steps, needs_model=not cfg.model.path, signal_s=c.signal_s,
                python=python, overrides=("controller.host=0.0.0.0", *path_overrides(cfg, root)), root=root,
                run_root=absolute(cfg.run_root, root), setup=c.setup)
