"""One task of an MPMD step across het groups: where Slurm says it is, and an MPI allreduce over the world.

Prints one JSON line: het group, role rank/size (agentrl.launch.slurm_env), MPI rank/size, allreduce sum.
"""
import json

from mpi4py import MPI

from agentrl.launch import slurm_env

comm = MPI.COMM_WORLD
place = slurm_env.read()
assert place is not None
total = comm.allreduce(comm.Get_rank() + 1)
print(json.dumps({"het_group": place.het_group, "rank": place.rank, "world_size": place.world_size,
                  "mpi_rank": comm.Get_rank(), "mpi_size": comm.Get_size(), "env_mpi_rank": place.mpi_rank,
                  "sum": total}), flush=True)
