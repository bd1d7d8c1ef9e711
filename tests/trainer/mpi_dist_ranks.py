"""Ranks of an MPMD world for test_mpi_dist_env.py (a program run under mpiexec, not a test).

    mpiexec -n 3 python -m mpi4py THIS OUT_DIR 2

World ranks 0..T-1 (T = the second argument) make torchrun's variables from MPI (`mpi_torch_env`), start a
gloo process group with them and all-reduce their rank + 1; the others stand for rollout ranks: they check
that they are refused, then exit. Each rank writes OUT_DIR/rank-<world rank>.json.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from mpi4py import MPI


def main(out: Path, trainer_ranks: int) -> None:
    from agentrl.trainer.parallel import close_distributed, dist_env, init_distributed, mpi_torch_env

    rank = MPI.COMM_WORLD.Get_rank()
    if rank >= trainer_ranks:
        try:
            mpi_torch_env(MPI.COMM_WORLD, trainer_ranks)
            record = {"refused": False}
        except ValueError as e:
            record = {"refused": str(e)}
    else:
        import torch
        import torch.distributed as dist

        env = mpi_torch_env(MPI.COMM_WORLD, trainer_ranks)
        os.environ.update(env)
        init_distributed(dist_env(env), timeout_s=60)
        total = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(total)
        close_distributed()
        record = {"env": env, "sum": float(total)}
    (out / f"rank-{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
