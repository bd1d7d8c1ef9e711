"""Data-parallel trainer ranks inside an MPMD world: `mpi_torch_env` gives the first T world ranks torchrun's
variables from MPI (rank, world size, local rank, one rendezvous address picked by rank 0), and a gloo
process group started from them works; rollout ranks of the same world take no part."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.launch.local import mpiexec

ROOT = Path(__file__).resolve().parents[2]
RANKS = Path(__file__).resolve().parent / "mpi_dist_ranks.py"


def test_first_trainer_ranks_of_the_world_meet_in_a_process_group(tmp_path: Path) -> None:
    pytest.importorskip("mpi4py")
    cmd = [mpiexec(), "-n", "3", sys.executable, "-m", "mpi4py", str(RANKS), str(tmp_path), "2"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1",
                               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(3)]
    envs = [g["env"] for g in got[:2]]
    assert [(e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"]) for e in envs] == [("0", "2", "0"), ("1", "2", "1")]
    assert envs[0]["MASTER_ADDR"] == envs[1]["MASTER_ADDR"] == "127.0.0.1"  # one host: loopback
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"] and int(envs[0]["MASTER_PORT"]) > 0
    assert [g["sum"] for g in got[:2]] == [3.0, 3.0]  # 1 + 2 over the two trainer ranks only
    assert "world rank 2 of 3 is not one of the 2 trainer ranks" in got[2]["refused"]
