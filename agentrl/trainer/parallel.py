"""Data-parallel plumbing of the trainer: process group, model wrapping, gradient synchronization.

What this module is: the one place that knows how many ranks there are and how gradients meet.

- `dist_env` reads rank / world size from the launcher's environment (torchrun's RANK, WORLD_SIZE,
  LOCAL_RANK; or Slurm's SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID when MASTER_ADDR/MASTER_PORT are set);
  `init_distributed` starts the default process group from it (env:// rendezvous): NCCL on GPU, gloo on CPU.
  Under mpiexec (the asynchronous schedule's MPMD world) `mpi_torch_env` makes those variables from MPI.
- `Parallel` wraps the model (DDP replicas, or FSDP2 `fully_shard` per decoder layer), picks the mixed
  precision, decides which micro-batches a rank runs, and reduces statistics.

How the update stays exact across layouts: every rank holds the whole step's batch (advantages and task
statistics are computed on it, identically everywhere), the micro-batch rows are global and handed out
round robin, each rank's loss is a *sum* over its tokens divided by the *global* action-token count, and
the ranks' gradients are summed. DDP and FSDP2 average gradients over ranks, so the loss is scaled by the
world size (`grad_scale`) to turn that average into the sum. Ranks with fewer micro-batches than others
run empty ones, so every rank makes the same collective calls.

What it is not: no algorithm math (that is `agentrl.algorithms`) and no tensor/pipeline parallelism.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger("agentrl.trainer")

PARALLEL_KINDS = ("none", "ddp", "fsdp2")
MIXED_PRECISION = ("auto", "bf16", "fp32")


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0


def dist_env(environ: Mapping[str, str] | None = None) -> DistEnv:
    """This process's place among the trainer ranks, from the launcher's environment variables."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:  # torchrun, or set by hand
        return DistEnv(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)))
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and "MASTER_ADDR" in env and "MASTER_PORT" in env:
        return DistEnv(int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", 0)))
    return DistEnv()


def mpi_torch_env(comm: Any, trainer_ranks: int) -> dict[str, str]:
    """torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) for a trainer rank of an
    MPMD world whose first `trainer_ranks` ranks are the trainer's (mpiexec and `srun --mpi=pmi2` set none).

    The rank is the world rank; the local rank is the rank among the trainer ranks on this host. Trainer rank
    0 picks the rendezvous address (its host, loopback when every trainer rank is on it; a free port) and
    shares it, unless MASTER_ADDR and MASTER_PORT are set there already. Collective over the trainer ranks
    only (`Create_group`): the rollout ranks of the same world take no part.

    Args:
        comm: the MPMD world (mpi4py `COMM_WORLD`).
        trainer_ranks: T, the number of trainer ranks (world ranks 0..T-1).
    """
    import socket

    rank = comm.Get_rank()
    if not 0 <= rank < trainer_ranks <= comm.Get_size():
        raise ValueError(f"world rank {rank} of {comm.Get_size()} is not one of the {trainer_ranks} trainer ranks")
    group = comm.Get_group().Range_incl([(0, trainer_ranks - 1, 1)])
    trainers = comm.Create_group(group)
    group.Free()
    try:
        from mpi4py import MPI

        host = trainers.Split_type(MPI.COMM_TYPE_SHARED)
        local_rank, on_one_host = host.Get_rank(), host.Get_size() == trainer_ranks
        host.Free()
        address = None
        if rank == 0:
            if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
                address = (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"])
            else:
                with socket.socket() as s:  # a port free now; the process group binds it moments later
                    s.bind(("", 0))
                    port = s.getsockname()[1]
                address = ("127.0.0.1" if on_one_host else socket.gethostname(), str(port))
        addr, port = trainers.bcast(address, root=0)
    finally:
        trainers.Free()
    return {"RANK": str(rank), "WORLD_SIZE": str(trainer_ranks), "LOCAL_RANK": str(local_rank),
            "MASTER_ADDR": addr, "MASTER_PORT": str(port)}


def init_distributed(env: DistEnv, backend: str | None = None, timeout_s: float = 1800.0) -> torch.device:
    """Start the default process group when there is more than one rank; return this rank's device.

    The rendezvous is env:// (MASTER_ADDR, MASTER_PORT). Backend: NCCL when CUDA is available, else gloo.
    """
    cuda = torch.cuda.is_available()
    # a rank bound to its own GPU (srun --gpus-per-task, --gpu-bind) sees one device; one that sees its node's
    # GPUs takes its local rank's
    device = torch.device("cuda", env.local_rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if env.world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend or ("nccl" if cuda else "gloo"), rank=env.rank, world_size=env.world_size,
                                timeout=timedelta(seconds=timeout_s))
    elif env.world_size > 1 and dist.get_world_size() != env.world_size:
        # someone else's default group (vLLM makes one of its own): gradients would meet the wrong ranks
        raise RuntimeError(f"a default process group of {dist.get_world_size()} ranks exists already; the trainer "
                           f"needs its own of {env.world_size}")
    return device


def close_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices natively (AVX512-BF16 or AMX), as oneDNN reports it."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def resolve_dtype(mixed_precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast / FSDP2 compute dtype, or None for full float32.

    "auto" means bf16 where the device computes it natively and fast (CUDA with bf16 support); CPUs run
    float32 (bf16 autocast works there too — ask for "bf16" — but it trades exactness for little speed on
    the small matrices a CPU trains).
    """
    if mixed_precision not in MIXED_PRECISION:
        raise ValueError(f"mixed_precision must be one of {MIXED_PRECISION}, got {mixed_precision!r}")
    if mixed_precision == "bf16":
        if device.type == "cpu" and not cpu_has_fast_bf16():
            log.warning("trainer.mixed_precision=bf16 on a CPU without native bf16 (%s): its bf16 matrix products "
                        "are emulated, tens of times slower than float32; trainer.mixed_precision=auto computes "
                        "in float32 here (published weights keep the model's own dtype either way)",
                        torch.backends.cpu.get_cpu_capability())
        return torch.bfloat16
    if mixed_precision == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None


class Parallel:
    """The data-parallel layout of one trainer process (a single process is the layout of one)."""

    def __init__(self, kind: str = "none", env: DistEnv | None = None, device: torch.device | None = None,
                 mixed_precision: str = "fp32") -> None:
        if kind not in PARALLEL_KINDS:
            raise ValueError(f"parallel must be one of {PARALLEL_KINDS}, got {kind!r}")
        self.env = env or DistEnv()
        if self.env.world_size > 1 and kind == "none":
            raise ValueError(f"parallel='none' with {self.env.world_size} ranks: use ddp or fsdp2")
        if self.env.world_size > 1 and not dist.is_initialized():
            raise RuntimeError("more than one rank but no process group: call init_distributed first")
        self.kind = kind
        self.device = device or torch.device("cpu")
        self.dtype = resolve_dtype(mixed_precision, self.device)

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def is_main(self) -> bool:
        """Whether this rank is the hub: trainer rank 0, which alone talks to the rollout ranks (glossary: §11)."""
        return self.env.rank == 0

    @property
    def distributed(self) -> bool:
        return self.env.world_size > 1

    @property
    def sharded(self) -> bool:
        return self.distributed and self.kind == "fsdp2"

    @property
    def grad_scale(self) -> float:
        """Loss factor that turns DDP's / FSDP2's gradient average over ranks into a sum."""
        return float(self.env.world_size) if self.distributed else 1.0

    # ------------------------------------------------------------------------------------ models
    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """Put the trainable model on this rank's device and wrap it for the layout (call before making the
        optimizer: FSDP2 replaces parameters by sharded ones)."""
        if self.sharded:
            self._shard(model)
            return model
        model.to(self.device)
        if self.distributed:
            from torch.nn.parallel import DistributedDataParallel

            # Buffers (rotary tables) are constants: broadcasting them each forward would be a wasted collective.
            ids = [self.device.index] if self.device.type == "cuda" else None
            return DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)
        return model

    def wrap_frozen(self, model: torch.nn.Module) -> torch.nn.Module:
        """A model that is only evaluated (the KL reference): no gradients, sharded like the policy under FSDP2."""
        model.requires_grad_(False).eval()
        if self.sharded:
            self._shard(model)
        else:
            model.to(self.device)
        return model

    def _shard(self, model: torch.nn.Module) -> None:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=self.dtype, reduce_dtype=torch.float32) if self.dtype else None
        kwargs: dict[str, Any] = {"mp_policy": mp} if mp is not None else {}
        names = set(getattr(model, "_no_split_modules", None) or ())
        for layer in [m for m in model.modules() if type(m).__name__ in names]:
            fully_shard(layer, **kwargs)
        fully_shard(model, **kwargs)  # the rest (embeddings, tied head, final norm) as one group

    def autocast(self) -> AbstractContextManager[Any]:
        """Mixed-precision compute for forward passes (FSDP2 casts parameters itself instead)."""
        if self.dtype is None or self.sharded:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def grad_sync(self, model: torch.nn.Module, last: bool) -> AbstractContextManager[Any]:
        """Around the forward and backward of one micro-batch: DDP all-reduces only after the last one.

        FSDP2 reduce-scatters after every micro-batch instead: the accumulated gradient then stays sharded,
        which is the point of sharding (a skipped sync would keep whole unsharded gradients per rank).
        """
        if self.distributed and self.kind == "ddp" and not last:
            return model.no_sync()  # type: ignore[operator]
        return nullcontext()

    def share(self, num_micro_batches: int) -> list[int | None]:
        """The global micro-batches this rank runs, round robin; None marks an empty stand-in so that every
        rank runs ceil(n / world_size) of them (at least one)."""
        per_rank = max(1, -(-num_micro_batches // self.world_size))
        mine = list(range(self.rank, num_micro_batches, self.world_size))
        return [*mine, *([None] * (per_rank - len(mine)))]

    # ------------------------------------------------------------------------------------ reductions
    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if not self.distributed:
            return t
        x = t.to(self.device)
        dist.all_reduce(x)
        return x.to(t.device)

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def clip_grad_norm(self, params: Iterable[torch.nn.Parameter], max_norm: float) -> float:
        """Global gradient norm (over all ranks' shards), clipping to `max_norm` when it is > 0."""
        params = [p for p in params if p.grad is not None]
        if not params:
            return 0.0
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        if max_norm > 0:
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        if hasattr(norm, "full_tensor"):  # a DTensor under FSDP2
            norm = norm.full_tensor()
        return float(norm)

    # ------------------------------------------------------------------------------------ state
    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """Whole (unsharded, unwrapped) weights on CPU on the hub; an empty dict on the other ranks. Collective."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return sd if self.is_main else {}
