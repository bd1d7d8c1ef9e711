"""`cluster`: where and how the roles run (local processes or one Slurm job), the schedule, and each het group's
topology (nodes, ranks, GPUs, engines) and Slurm settings."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrl.config.errors import _check

_SLURM_TIME = re.compile(r"^(\d+-)?\d+(:\d{2}){0,2}$")
_SLURM_MEM = re.compile(r"^\d+[KMGT]?$")


def slurm_seconds(time: str) -> int:
    """Slurm's time format in seconds: `MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`."""
    days, _, rest = time.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    if days:  # after a day count the first field is hours
        h, m, sec = (parts + [0, 0])[:3]
    elif len(parts) == 3:
        h, m, sec = parts
    else:  # MM or MM:SS
        h, m, sec = 0, parts[0], (parts[1] if len(parts) > 1 else 0)
    return int(days or 0) * 86400 + h * 3600 + m * 60 + sec


@dataclass(frozen=True)
class SlurmGroupConfig:
    """Where one het group (or, with `cluster.hetjob: false`, one role's job) is queued. Empty strings
    leave the site's default (no `#SBATCH` line is rendered for them)."""
    partition: str = ""
    account: str = ""
    qos: str = ""
    time: str = "01:00:00"
    """Wall-clock limit, Slurm's format (`MM`, `HH:MM:SS`, `D-HH:MM:SS`)."""
    cpus_per_task: int = 2
    mem: str = ""
    """Memory per node (`--mem`), Slurm's format (`64G`; `0`: all of each node's memory, for nodes the job
    has to itself); "" leaves the site default. Every step of the group then runs with `--mem=0` (the job's
    memory on its nodes, without taking it from the group's other steps)."""
    mem_per_gpu: str = ""
    """Memory per allocated GPU (`--mem-per-gpu`, e.g. `120G`), instead of `mem`; only for groups with GPUs."""
    constraint: str = ""

    def validate(self, p: str) -> None:
        _check(bool(_SLURM_TIME.match(self.time)), f"{p}.time", f"{self.time!r} is not a Slurm time (D-HH:MM:SS)")
        _check(self.cpus_per_task >= 1, f"{p}.cpus_per_task", "must be >= 1")
        for name in ("mem", "mem_per_gpu"):
            value = getattr(self, name)
            _check(value == "" or bool(_SLURM_MEM.match(value)), f"{p}.{name}",
                   f"{value!r} is not a Slurm memory size (e.g. 64G)")
        _check(not (self.mem and self.mem_per_gpu), f"{p}.mem_per_gpu",
               "set mem or mem_per_gpu, not both (Slurm refuses --mem with --mem-per-gpu)")
        for name in ("partition", "account", "qos", "constraint"):
            _check(not any(c.isspace() for c in getattr(self, name)), f"{p}.{name}", "must not contain spaces")


@dataclass(frozen=True)
class TrainerTopology:
    """The trainer het group: one rank per GPU (or `ranks_per_node` CPU ranks where gpus_per_node is 0)."""
    nodes: int = 1
    gpus_per_node: int = 0
    ranks_per_node: int = 1
    """CPU ranks per node; on GPU nodes it must equal gpus_per_node (one rank per GPU)."""
    collective_timeout_s: float = 0.0
    """torch.distributed's collective timeout for the trainer's process group: a rank stuck in a collective
    (a peer died, a hung NCCL call) fails after this long instead of holding the job until its time limit.
    0: 30 minutes, or half the group's `slurm.time` where that is shorter; a set value must be shorter than
    `slurm.time`; the rendered scripts also set TORCH_NCCL_ASYNC_ERROR_HANDLING=1
    on GPU trainer steps, so a timed-out NCCL collective ends the process (and srun the step)."""
    slurm: SlurmGroupConfig = field(default_factory=SlurmGroupConfig)

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def collective_timeout(self) -> float:
        """`collective_timeout_s`, with 0 resolved (seconds)."""
        return self.collective_timeout_s or min(1800.0, slurm_seconds(self.slurm.time) / 2)

    def validate(self, p: str) -> None:
        _check(self.nodes >= 1, f"{p}.nodes", "must be >= 1")
        _check(self.gpus_per_node >= 0, f"{p}.gpus_per_node", "must be >= 0")
        _check(self.ranks_per_node >= 1, f"{p}.ranks_per_node", "must be >= 1")
        _check(self.gpus_per_node == 0 or self.ranks_per_node == self.gpus_per_node, f"{p}.ranks_per_node",
               f"must equal gpus_per_node ({self.gpus_per_node}): one trainer rank per GPU")
        self.slurm.validate(f"{p}.slurm")
        _check(self.slurm.mem_per_gpu == "" or self.gpus_per_node > 0, f"{p}.slurm.mem_per_gpu",
               "needs gpus_per_node > 0 (no GPUs to count memory by)")
        limit = slurm_seconds(self.slurm.time)
        _check(0 <= self.collective_timeout_s < limit, f"{p}.collective_timeout_s",
               f"must be >= 0 (0: auto) and shorter than {p}.slurm.time ({self.slurm.time} = {limit} s)")


@dataclass(frozen=True)
class RolloutTopology:
    """The rollout het group: `ranks` processes, each driving its own vLLM engines: `engines_per_rank` current
    ones (each episode's turns on one of them, `agentrl.rollout.engine_pool`) plus `lagging_engines_per_rank`
    lagging ones (cross-policy sampling). The engine settings (dtype, tensor_parallel_size,
    gpu_memory_utilization, enforce_eager, max_num_seqs, kv_cache_gib) reach every engine
    (`agentrl.rollout.from_config`). With gpus_per_node 0 (CPU) the engines run in the rank's process, float32
    and eager, as before; on GPU nodes each engine runs in its own process on its own tensor_parallel_size GPUs
    of the rank's (`agentrl.rollout.placement`; docs/slurm.md, GPU placement)."""
    nodes: int = 1
    ranks: int = 1
    engines_per_rank: int = 1
    """Engines of the current pool (always the newest weights) per rank; a rank spreads its episodes over them
    (each episode on the least busy one at its first turn). Engine ids: current engine j of rank r is
    r * engines_per_rank + j (with one per rank: the rank)."""
    lagging_engines_per_rank: int = 0
    """Engines of the lagging pool per rank (cross-policy sampling, docs/architecture.md §5); 0: none. Engine ids:
    lagging engine k of rank r is 1000 + r * lagging_engines_per_rank + k."""
    lagging_refresh_steps: int = 25
    """K: a lagging engine loads the newest weights once the current engine is K or more versions ahead of
    it, so it samples at most K - 1 versions behind; its tokens are trained on up to algo.max_staleness + K
    versions old (docs/pipeline.md, cross-policy sampling)."""
    gpus_per_node: int = 0
    gpu_memory_utilization: float = 0.85
    """vLLM's `gpu_memory_utilization`: the share of each of an engine's GPUs it may take (weights + KV cache);
    no other engine of the rank uses them."""
    tensor_parallel_size: int = 1
    """GPUs per engine: engine k of a rank (current ones first, then lagging) takes the rank's GPUs
    [k * tensor_parallel_size, (k + 1) * tensor_parallel_size), in CUDA_VISIBLE_DEVICES order."""
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    """vLLM's dtype (auto: the checkpoint's). On CPU (gpus_per_node 0) auto means float32, as before."""
    enforce_eager: bool = True
    """vLLM's enforce_eager: true runs eager PyTorch; false captures CUDA graphs (faster decoding on GPUs,
    more start-up time and memory). CPU engines always run eager."""
    max_num_seqs: int = 0
    """Sequences one engine batches at once (vLLM's max_num_seqs); 0: rollout.concurrency."""
    kv_cache_gib: float = 0.0
    """KV-cache size per engine in GiB, the one KV-cache setting. GPU engines: vLLM's kv_cache_memory_bytes,
    instead of what gpu_memory_utilization leaves after the weights (0: that remainder). CPU engines (in the
    rank's process): whole GiB, vLLM's VLLM_CPU_KVCACHE_SPACE (0: 1 GiB)."""
    slurm: SlurmGroupConfig = field(default_factory=SlurmGroupConfig)

    @property
    def cpu_kv_cache_gib(self) -> int:
        """A CPU engine's KV cache in whole GiB (`kv_cache_gib`, 0: 1)."""
        return int(self.kv_cache_gib) or 1

    @property
    def gpus_per_rank(self) -> int:
        return (self.engines_per_rank + self.lagging_engines_per_rank) * self.tensor_parallel_size

    def engine_settings(self, concurrency: int, linger_ms: float) -> dict[str, Any]:
        """Keyword arguments of each of a rank's vLLM engines (`agentrl.rollout.engine.VLLMEngine`), beside the
        GPUs it runs on (`agentrl.rollout.from_config.rank_devices`).

        CPU (gpus_per_node 0): float32 unless a dtype is set, always eager, no GPU memory settings, and
        `linger_ms` (`rollout.linger_ms`, a sampling setting) as `linger_s`.
        GPU: the configured dtype, tensor parallel size and eager/CUDA-graph choice, and the whole
        gpu_memory_utilization: every engine runs in its own process on GPUs of its own."""
        seqs = self.max_num_seqs or concurrency
        if not self.gpus_per_node:
            return {"dtype": "float32" if self.dtype == "auto" else self.dtype, "max_num_seqs": seqs,
                    "linger_s": linger_ms / 1e3, "kv_cache_gib": self.cpu_kv_cache_gib}
        kv = int(self.kv_cache_gib * (1 << 30)) or None
        return {"dtype": self.dtype, "max_num_seqs": seqs, "enforce_eager": self.enforce_eager,
                "tensor_parallel_size": self.tensor_parallel_size,
                "gpu_memory_utilization": self.gpu_memory_utilization, "kv_cache_memory_bytes": kv}

    def validate(self, p: str) -> None:
        for name in ("nodes", "ranks", "engines_per_rank", "tensor_parallel_size", "lagging_refresh_steps"):
            _check(getattr(self, name) >= 1, f"{p}.{name}", "must be >= 1")
        _check(self.lagging_engines_per_rank >= 0, f"{p}.lagging_engines_per_rank", "must be >= 0")
        # engine ids (agentrl.types): current < 1000 <= lagging <= 32767 (the shards' int16 engine array)
        _check(self.ranks * self.engines_per_rank <= 1000, f"{p}.ranks",
               "ranks x engines_per_rank must be <= 1000 (current engine ids stay below the lagging ones)")
        _check(1000 + self.ranks * self.lagging_engines_per_rank <= 32768, f"{p}.lagging_engines_per_rank",
               "ranks x lagging_engines_per_rank must be <= 31768 (engine ids are int16)")
        _check(self.ranks % self.nodes == 0, f"{p}.ranks", f"must be a multiple of nodes ({self.nodes})")
        _check(0.0 < self.gpu_memory_utilization <= 1.0, f"{p}.gpu_memory_utilization", "must be in (0, 1]")
        _check(self.max_num_seqs >= 0, f"{p}.max_num_seqs", "must be >= 0 (0: rollout.concurrency)")
        _check(self.kv_cache_gib >= 0, f"{p}.kv_cache_gib", "must be >= 0 (0: the engine's default)")
        _check(bool(self.gpus_per_node) or self.kv_cache_gib == int(self.kv_cache_gib), f"{p}.kv_cache_gib",
               "must be a whole number of GiB for CPU engines (gpus_per_node 0)")
        _check(self.gpus_per_node >= 0, f"{p}.gpus_per_node", "must be >= 0")
        if self.gpus_per_node:  # every engine gets its own GPUs: the node must hold exactly the ranks' engines
            per_rank, rem = divmod(self.gpus_per_node, self.ranks // self.nodes)
            _check(rem == 0, f"{p}.gpus_per_node",
                   f"must be a multiple of the ranks per node ({self.ranks // self.nodes})")
            _check(self.gpus_per_rank <= per_rank, f"{p}.tensor_parallel_size",
                   f"(engines_per_rank {self.engines_per_rank} + lagging_engines_per_rank "
                   f"{self.lagging_engines_per_rank}) x tensor_parallel_size {self.tensor_parallel_size} = "
                   f"{self.gpus_per_rank} GPUs per rollout rank, but a rank has gpus_per_node / (ranks / nodes) = "
                   f"{per_rank}")
            need = self.ranks // self.nodes * self.gpus_per_rank
            _check(self.gpus_per_node == need, f"{p}.gpus_per_node",
                   f"must equal ranks per node x (engines_per_rank + lagging_engines_per_rank) x "
                   f"tensor_parallel_size = {need} (no GPU of a rollout node left idle)")
        _check(self.slurm.mem_per_gpu == "" or self.gpus_per_node > 0, f"{p}.slurm.mem_per_gpu",
               "needs gpus_per_node > 0 (no GPUs to count memory by)")
        self.slurm.validate(f"{p}.slurm")


@dataclass(frozen=True)
class EnvTopology:
    """The env het group: the controller (by default) and `envs.workers` env workers over `nodes` nodes."""
    nodes: int = 1
    apptainer_image: str = ""
    """The env workers' image (built from containers/agentrl.def); "" runs them on the node's Python."""
    binds: tuple[str, ...] = ()
    """Extra host paths bound into the workers' containers (the run dir and data dir always are)."""
    os_sandbox_image: str = ""
    """The `os` task's per-session sandbox image (built from containers/os-sandbox.def); the launcher
    writes it into envs.task_options.os.sandbox (backend apptainer). "" leaves the task's own options."""
    slurm: SlurmGroupConfig = field(default_factory=SlurmGroupConfig)

    def validate(self, p: str) -> None:
        _check(self.nodes >= 1, f"{p}.nodes", "must be >= 1")
        self.slurm.validate(f"{p}.slurm")


@dataclass(frozen=True)
class ClusterConfig:
    launcher: Literal["local", "slurm"] = "local"
    """local: roles as processes on this machine | slurm: one Slurm job through submitit (jobs.launch)."""
    role_timeout_s: float = 3600.0
    """How long one role waits for another: the trainer this long for a step's groups, for the expert's
    demonstrations and for the rollout ranks to close their channels; a rollout rank this long for new weights.
    A bound on each wait, not on the run: a run of many hours waits no longer for any one thing."""
    time_limit_s: float = 0.0
    """The local launcher's limit on the whole run's wall time: it stops the run past it (0: none; each role's
    waits are bounded by `role_timeout_s` anyway). Under Slurm the job's `slurm.time` is the limit."""
    max_restarts: int = 3
    """Times a dead env worker is started again (per worker) before it counts as failed: by the local launcher
    (which also restarts the asynchronous MPI world as often) and by the rendered Slurm scripts (each worker
    its own srun step; past the bound that worker stays down and the run goes on with the others; the
    asynchronous MPMD step is started again as often, after its rendezvous keys are cleared)."""
    schedule: Literal["sync", "async"] = "async"
    """async (the default): the trainer and `cluster.rollout.ranks` rollout ranks in one MPI world (mpiexec),
    trajectories over MPI, in-flight weight updates (docs/pipeline.md); with transport.channel=files, separate
    processes without MPI. sync: the baseline the benchmarks compare against, the same pipeline with its
    numbers fixed (`RunConfig.pipeline`: max_staleness 0 and inflight drain whatever `algo` and `transport`
    say, one step's groups per step, one rollout rank): rollout and trainer take turns."""
    engine_threads: int = 2
    """OMP_NUM_THREADS of each rollout rank under mpiexec (which would otherwise start it with 1, and
    vLLM's CPU attention then aborts)."""
    hetjob: bool = True
    """One heterogeneous job (trainer, rollout, env groups); false: one job per role, chained with
    dependencies, for sites that forbid hetjobs (needs transport.channel=files)."""
    controller_placement: Literal["env", "trainer"] = "env"
    """The het group whose first node runs the controller: env | trainer."""
    signal_s: int = 300
    """Seconds before the time limit at which Slurm sends USR1 (checkpoint, then requeue)."""
    python: str = ".venv/bin/python"
    """The Python the jobs run: a path (a relative one is resolved against the repository root when the script
    is rendered) or a bare name found on PATH after `setup` (e.g. `python3`)."""
    mpi: Literal["pmi2", "pmix", "none"] = "pmi2"
    """srun's MPI plugin (`--mpi=`) for the steps that are MPI programs (the asynchronous schedule's trainer +
    rollout step). pmi2 suits the MPICH wheel; pmix an MPI built with PMIx (OpenMPI); none for an MPI that
    starts itself. Steps that run no MPI (controller, env workers, the synchronous roles, the model build)
    always get `--mpi=none`, so a site without PMI2 can run them."""
    gpu_binding: Literal["gpus-per-task", "gres"] = "gpus-per-task"
    """How GPU groups ask for GPUs and bind them to tasks. gpus-per-task: `#SBATCH --gpus-per-node=N`, and each
    trainer task gets `--gpus-per-task=1 --gpu-bind=per_task:1`, each rollout task its engines' GPUs, so
    every task sees only its own (select/cons_tres, Slurm >= 21.08). gres: `#SBATCH --gres=gpu:N` and steps
    `--gres=gpu:<per node>`, for sites that account GPUs as GRES only: trainer tasks see their node's GPUs
    and take cuda:LOCAL_RANK (NCCL's peer-to-peer paths stay visible), rollout tasks are bound with
    `--gpu-bind=mask_gpu:...` to disjoint GPUs."""
    setup: tuple[str, ...] = ()
    """Shell lines the job runs before anything else and before every step's program on its node (module loads,
    `source /path/venv/bin/activate`, exports), e.g. `[module load cuda/12.4, module load apptainer]`."""
    trainer: TrainerTopology = field(default_factory=TrainerTopology)
    rollout: RolloutTopology = field(default_factory=RolloutTopology)
    env: EnvTopology = field(default_factory=EnvTopology)

    def validate(self, p: str) -> None:
        for i, line in enumerate(self.setup):
            _check("\n" not in line and line.strip() != "", f"{p}.setup[{i}]", "must be one non-empty shell line")
        _check(self.engine_threads >= 1, f"{p}.engine_threads", "must be >= 1")
        _check(self.role_timeout_s > 0, f"{p}.role_timeout_s", "must be positive")
        _check(self.time_limit_s >= 0, f"{p}.time_limit_s", "must be >= 0 (0: no limit)")
        _check(self.max_restarts >= 0, f"{p}.max_restarts", "must be >= 0")
        _check(self.signal_s >= 0, f"{p}.signal_s", "must be >= 0")
        _check(bool(self.python), f"{p}.python", "must name a Python")
        self.trainer.validate(f"{p}.trainer")
        self.rollout.validate(f"{p}.rollout")
        self.env.validate(f"{p}.env")
        if self.schedule == "sync":
            # The baseline takes turns: one rank samples a step's groups while the trainer waits for all of them.
            _check(self.rollout.ranks == 1, f"{p}.rollout.ranks",
                   f"the synchronous schedule runs one rollout rank, not {self.rollout.ranks}; "
                   "use cluster.schedule=async (the default) for more")
