"""A rollout rank on the asynchronous schedule: episodes never wait for the trainer (except at the staleness
bound), trajectories go to shards/rollout-<rank>/ and over MPI, weights are swapped in flight.

    python -m jobs.train --preset demo cluster.schedule=async cluster.rollout.ranks=2    # starts the MPI world for you
    mpiexec -n 1 python -m mpi4py -m jobs.trainer_async --run-dir R : \\
            -n 2 -env OMP_NUM_THREADS 2 python -m mpi4py -m jobs.rollout_async --run-dir R
    srun --mpi=pmi2 --het-group=0 python -m mpi4py -m jobs.trainer_async --run-dir R : \\
         --het-group=1 python -m mpi4py -m jobs.rollout_async --run-dir R

The rollout rank is the MPI world rank minus 1 (the trainer is world rank 0).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    from mpi4py import MPI  # first: in an MPMD world every rank's MPI_Init waits for all the others

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True, type=Path)
    args = ap.parse_args(argv)
    rank = MPI.COMM_WORLD.Get_rank() - 1
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(name)s %(levelname)s [rollout-{rank}] %(message)s")
    out = asyncio.run(amain(args.run_dir, rank))
    logging.getLogger("agentrl.rollout").info("rank %d done %s", rank, json.dumps(out.get("summary", {}))[:2000])


async def amain(run_dir: Path, rank: int) -> dict:
    from transformers import AutoTokenizer

    from agentrl.auth import run_secret
    from agentrl.config import load_config
    from agentrl.envs.client import GatewayClient
    from agentrl.launch import rendezvous
    from agentrl.monitor.tensorboard import make_monitor
    from agentrl.rollout import async_role
    from agentrl.rollout.async_weights import BroadcastWeights, DirWeights
    from agentrl.rollout.env_latency import maybe_slow
    from agentrl.rollout.from_config import engine_factory, make_plan
    from agentrl.transport.mpi_channel import RolloutChannel

    cfg = load_config(str(run_dir / "config.yaml"))
    r, tr = cfg.rollout, cfg.transport
    model_dir = Path(cfg.model.path) if cfg.model.path else run_dir / "model"
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    plan = make_plan(cfg)
    ap = async_role.AsyncPlan(rank, cfg.cluster.rollout.ranks, cfg.algo.max_staleness, tr.inflight)
    timeout = cfg.cluster.role_timeout_s

    def channel() -> RolloutChannel:
        return RolloutChannel.world(rank, trainer=0, timeout_s=timeout)

    def weights(ch: RolloutChannel):
        if tr.weights == "broadcast":
            return BroadcastWeights(run_dir, rank, cfg.cluster.rollout.ranks, lambda: rendezvous.read(run_dir), timeout)
        return DirWeights(run_dir, tr.poll_s)

    url = rendezvous.wait_for(run_dir, "controller_url", timeout_s=120)
    monitor = make_monitor(run_dir, f"rollout-{rank}", cfg.monitor.tensorboard)
    try:
        async with GatewayClient(url, keepalive_s=cfg.controller.keepalive_s, secret=run_secret(run_dir)) as gateway:
            client = maybe_slow(gateway, r.env_latency_s, r.env_latency_sigma, cfg.seed * 100 + rank)
            make_engine = engine_factory(cfg, model_dir, client, tok, rank=rank)
            return await async_role.run(run_dir, client, tok, make_engine, plan, ap, monitor, channel, weights)
    finally:
        monitor.close()


if __name__ == "__main__":
    main()
