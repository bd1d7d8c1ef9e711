"""The trainer role: the hub of the pipeline, receiving trajectories from every rollout rank while it trains;
each step takes the complete groups available, trains, publishes v<N+1> (`agentrl.trainer.role`).

    python -m jobs.train --preset demo                           # starts the MPI world for you
    mpiexec -n 1 python -m mpi4py -m jobs.trainer --run-dir R : -n 2 ... python -m mpi4py -m jobs.rollout --run-dir R
    srun --mpi=pmi2 --het-group=0 python -m mpi4py -m jobs.trainer --run-dir R : --het-group=1 ...
    python -m jobs.trainer --run-dir R          # transport.channel=files: no MPI, a process (or job) of its own

Both schedules run this role: `cluster.schedule=sync` is the pipeline with max_staleness 0 and one step's
groups per step (`RunConfig.pipeline`).

With T = cluster.trainer.nodes x ranks_per_node data-parallel trainer ranks (MPI channel only), the trainer
is the first program of the world with T ranks (`mpiexec -n T ... : -n R ...`): world ranks 0..T-1 form
the trainer's own process group (rank, world size and rendezvous address from MPI, trainer.parallel picks
DDP or FSDP2), and world rank 0 is the hub that alone talks to the rollout ranks.

Weights go out as versioned directories, or (transport.weights=broadcast) also over the in-job gloo
broadcast whose TCPStore address the hub puts into rendezvous.json. With transport.channel=files it reads the
rollout ranks' shard segments and writes a notice file instead.

Under Slurm, USR1 (the job's warning; srun passes it to every rank of the step) and SIGTERM mean: finish the
step, checkpoint (with the queue's ledger), tell the rollout ranks to stop, and exit for the requeue.
"""
from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    from agentrl.config import load_config

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True, type=Path)
    args = ap.parse_args(argv)
    cfg = load_config(str(args.run_dir / "config.yaml"))
    files = cfg.transport.channel == "files"
    trainer_ranks = cfg.cluster.trainer.world_size
    torch_env: dict[str, str] = {}
    if not files:
        from mpi4py import MPI  # early: in an MPMD world every rank's MPI_Init waits for all the others

        world = MPI.COMM_WORLD
        if world.Get_rank() >= trainer_ranks:
            raise SystemExit(f"jobs.trainer must be one of MPI world ranks 0..{trainer_ranks - 1} (the first "
                             f"program of the MPMD world, with cluster.trainer nodes x ranks_per_node ranks); it is "
                             f"rank {world.Get_rank()}")
        if trainer_ranks > 1:
            from agentrl.trainer.parallel import mpi_torch_env

            torch_env = mpi_torch_env(world, trainer_ranks)
    rank = int(torch_env.get("RANK", 0))
    tag = "trainer" if rank == 0 else f"trainer-{rank}"
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(name)s %(levelname)s [{tag}] %(message)s")

    from agentrl.launch import rendezvous, slurm_env
    from agentrl.launch.preempt import Preemption
    from agentrl.monitor.tensorboard import make_monitor, write_config
    from agentrl.rollout.weight_sources import STORE_KEY
    from agentrl.trainer import role
    from agentrl.trainer.parallel import Parallel, close_distributed, dist_env, init_distributed
    from agentrl.transport import file_channel

    run_dir: Path = args.run_dir
    tr = cfg.transport
    model_dir = Path(cfg.model.path) if cfg.model.path else run_dir / "model"
    timeout = cfg.cluster.role_timeout_s

    start = file_channel.shard_positions(run_dir)  # before a resume drains them: overlap is harmless, a gap is not

    def channel(version: int):
        if files:
            return file_channel.FileTrainerChannel.open(run_dir, cfg.cluster.rollout.ranks, rendezvous.publish,
                                                        version=version, timeout_s=timeout, poll_s=tr.poll_s,
                                                        start=start)
        from agentrl.transport.mpi_channel import MpiTrainerChannel

        return MpiTrainerChannel.world(cfg.cluster.rollout.ranks, version=version, timeout_s=timeout)

    def broadcast():
        from agentrl.transport.broadcast import WeightBroadcast, open_store

        store = open_store("127.0.0.1", 0, 0, cfg.cluster.rollout.ranks + 1, timeout)
        rendezvous.publish(run_dir, **{STORE_KEY: {"host": "127.0.0.1", "port": store.port}})
        return WeightBroadcast(store, 0, cfg.cluster.rollout.ranks + 1, timeout_s=timeout)

    # The trainer ranks' own process group (gloo or NCCL; one rank: none), with the configured collective timeout
    # (shorter than the Slurm time limit): while the hub waits for groups it keeps the others' wait alive.
    os.environ.update(torch_env)  # env:// reads MASTER_ADDR and MASTER_PORT from the environment
    # MPI channel: the ranks come from the MPI world (torch_env); file channel: from the environment (one srun
    # step of T tasks through launch.slurm_env, or torchrun), else one rank
    env = dist_env(torch_env) if not files else dist_env()
    device = init_distributed(env, timeout_s=cfg.cluster.trainer.collective_timeout)
    par = Parallel(cfg.trainer.parallel, env, device, cfg.trainer.mixed_precision)
    monitor = make_monitor(run_dir, "trainer", cfg.monitor.tensorboard, rank=par.rank)
    write_config(monitor, cfg)  # the resolved config as text at step 0 (the hub's monitor; a null one elsewhere)
    # Outside Slurm a SIGTERM keeps its plain meaning (the local launcher stops the MPI world).
    preemption = Preemption().install() if slurm_env.job_id() else None
    try:
        role.run(run_dir, model_dir, cfg, monitor, channel, par=par, broadcast_factory=broadcast,
                 should_stop=(lambda: preemption.requested) if preemption else None)
    finally:
        monitor.close()
        close_distributed()
    if preemption is not None and preemption.requested:
        preemption.exit_for_requeue()


if __name__ == "__main__":
    main()
