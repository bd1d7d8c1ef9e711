"""The one place that reads Slurm's `SLURM_*` variables: this process's role, rank, world and peers.

Slurm describes a task differently by step shape, and none of the shapes names the het group directly
(Slurm 22.05 sets no SLURM_HET_GROUP in a step; seen on the CI cluster, captured in
tests/launch/data/*.env):

* an MPMD step `srun --het-group=0 A : --het-group=1 B` numbers every task of every group in one
  SLURM_PROCID / SLURM_NTASKS space (one MPI world), groups in order;
* a step on one group (`srun --het-group=1 B`) numbers its own tasks from 0.

`read()` turns either into a `SlurmPlace`: the rank and world size *within the role* (what
torch.distributed needs), and the rank and size of the step's MPI world (what MPI needs). The het group
comes from AGENTRL_HET_GROUP (the rendered scripts set it through this module's command line), else
from the MPMD numbering, else from the group whose node list is the step's.

Run as a program it is the wrapper the rendered scripts put in front of a role:

    srun --het-group=0 python -m agentrl.launch.slurm_env --het-group 0 -- python -m jobs.trainer ...

which exports RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (and AGENTRL_HET_GROUP) and
execs the role. Standard library only.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class SlurmPlace:
    job_id: str
    """The job's id (the het job's leader id in every group: stable across requeues)."""
    het_group: int | None
    """None outside a heterogeneous job."""
    het_size: int
    rank: int
    """Rank within this role's tasks of the step (torch.distributed's RANK)."""
    world_size: int
    local_rank: int
    master_addr: str
    """First node of this role's group: where rank 0 of the role listens."""
    master_port: int
    mpi_rank: int
    """Rank in the step's MPI world (every group of an MPMD step together)."""
    mpi_size: int
    restart_count: int
    """How many times Slurm requeued the job (0 on the first run)."""

    def torch_env(self) -> dict[str, str]:
        """The variables torchrun would set, for the role's own process group."""
        env = {"RANK": str(self.rank), "WORLD_SIZE": str(self.world_size), "LOCAL_RANK": str(self.local_rank),
               "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port)}
        if self.het_group is not None:
            env["AGENTRL_HET_GROUP"] = str(self.het_group)
        return env


def in_slurm(environ: Mapping[str, str] | None = None) -> bool:
    """True inside a Slurm job step or batch script."""
    env = os.environ if environ is None else environ
    return "SLURM_JOB_ID" in env


def job_id(environ: Mapping[str, str] | None = None) -> str | None:
    """The id that `scontrol requeue` / `squeue -j` take for this job (`<array id>_<task>` in an array)."""
    env = os.environ if environ is None else environ
    if env.get("SLURM_ARRAY_JOB_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID")


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's compressed node list → host names: `n[1-3,7],gpu05` → n1 n2 n3 n7 gpu05 (zero padding kept)."""
    hosts: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", hostlist):
        if plain:
            hosts.append(plain)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            width = len(lo)
            for i in range(int(lo), int(hi or lo) + 1):
                hosts.append(f"{prefix}{i:0{width}d}")
    return hosts


def master_port(job_id: str, het_group: int | None) -> int:
    """A port every rank of a role agrees on without talking: 20000 + (job id x 3 + group) mod 20000.

    Distinct per role and per job, so two jobs sharing a node rarely meet; MASTER_PORT overrides it."""
    base = int(re.sub(r"\D.*", "", job_id) or 0)
    return 20000 + (base * 3 + (het_group or 0)) % 20000


def _group_sizes(env: Mapping[str, str], het_size: int) -> list[int]:
    return [int(env.get(f"SLURM_NTASKS_HET_GROUP_{g}", env.get(f"SLURM_NTASKS_PACK_GROUP_{g}", "0")))
            for g in range(het_size)]


def _het_group(env: Mapping[str, str], het_size: int, procid: int, ntasks: int) -> int:
    if "AGENTRL_HET_GROUP" in env:
        return int(env["AGENTRL_HET_GROUP"])
    sizes = _group_sizes(env, het_size)
    if ntasks == sum(sizes) and len(sizes) > 1:  # an MPMD step over every group: ranks run group by group
        edge = 0
        for g, n in enumerate(sizes):
            edge += n
            if procid < edge:
                return g
    step_nodes = env.get("SLURM_JOB_NODELIST", "")
    matches = [g for g in range(het_size) if env.get(f"SLURM_JOB_NODELIST_HET_GROUP_{g}") == step_nodes]
    if len(matches) == 1:
        return matches[0]
    raise RuntimeError("cannot tell this task's het group from Slurm's variables; set AGENTRL_HET_GROUP "
                       "(the rendered scripts do, through `python -m agentrl.launch.slurm_env --het-group N`)")


def read(environ: Mapping[str, str] | None = None) -> SlurmPlace | None:
    """This task's place in the job, or None outside Slurm."""
    env = os.environ if environ is None else environ
    if not in_slurm(env):
        return None
    job_id = env["SLURM_JOB_ID"]
    procid = int(env.get("SLURM_PROCID", "0"))
    ntasks = int(env.get("SLURM_NTASKS", env.get("SLURM_NPROCS", "1")))
    het_size = int(env.get("SLURM_HET_SIZE", env.get("SLURM_PACK_SIZE", "0")))
    mpi_rank = int(env.get("PMI_RANK", procid))
    mpi_size = int(env.get("PMI_SIZE", ntasks))
    if het_size:
        group: int | None = _het_group(env, het_size, procid, ntasks)
        assert group is not None
        sizes = _group_sizes(env, het_size)
        if ntasks == sum(sizes) and het_size > 1:  # MPMD: this group's tasks start after the earlier groups'
            rank, world = procid - sum(sizes[:group]), sizes[group]
        else:
            rank, world = procid, ntasks
        nodes = env.get(f"SLURM_JOB_NODELIST_HET_GROUP_{group}", env.get("SLURM_JOB_NODELIST", ""))
    else:
        group, rank, world = None, procid, ntasks
        nodes = env.get("SLURM_STEP_NODELIST", env.get("SLURM_JOB_NODELIST", ""))
    hosts = expand_hostlist(nodes)
    return SlurmPlace(
        job_id=job_id, het_group=group, het_size=het_size, rank=rank, world_size=world,
        local_rank=int(env.get("SLURM_LOCALID", "0")),
        master_addr=env.get("MASTER_ADDR", hosts[0] if hosts else "127.0.0.1"),
        master_port=int(env.get("MASTER_PORT", master_port(job_id, group))),
        mpi_rank=mpi_rank, mpi_size=mpi_size, restart_count=int(env.get("SLURM_RESTART_COUNT", "0")),
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Export a role's rank variables from Slurm's, then exec the role.")
    ap.add_argument("--het-group", type=int, default=None, help="this step's het group (the script knows it)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- program args...")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command after --")
    env = dict(os.environ)
    if args.het_group is not None:
        env["AGENTRL_HET_GROUP"] = str(args.het_group)
    place = read(env)
    if place is not None:
        env.update(place.torch_env())
    sys.stdout.flush()
    os.execvpe(command[0], command, env)


if __name__ == "__main__":
    main()
