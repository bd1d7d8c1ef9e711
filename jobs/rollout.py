r"""A rollout rank: episodes never wait for the trainer (except at the staleness bound), trajectories go to
shards/rollout-<rank>/ and over MPI, weights are swapped in flight (`agentrl.rollout.role`).

    python -m jobs.train --preset demo cluster.rollout.ranks=2            # starts the MPI world for you
    mpiexec -n 1 python -m mpi4py -m jobs.trainer --run-dir R : \
            -n 2 -env OMP_NUM_THREADS 2 python -m mpi4py -m jobs.rollout --run-dir R
    srun --mpi=pmi2 --het-group=0 python -m mpi4py -m jobs.trainer --run-dir R : \
         --het-group=1 python -m mpi4py -m jobs.rollout --run-dir R

The rollout rank is the MPI world rank minus T, the number of trainer ranks (cluster.trainer nodes x
ranks_per_node; the trainer's hub is world rank 0). With transport.channel=files
there is no MPI world: each rank is a process (or job) of its own, told its rank, and may be restarted alone:

    python -m jobs.rollout --run-dir R --rank 1

Under Slurm a rollout rank ignores USR1 and SIGTERM (srun passes the job's signals to every rank of
the step): the trainer checkpoints and then sends the stop notice that ends this rank.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--rank", type=int, help="this rollout rank (transport.channel=files only; under MPI the "
                                             "rank comes from the world)")
    args = ap.parse_args(argv)
    if args.rank is None:
        from mpi4py import MPI  # early: in an MPMD world every rank's MPI_Init waits for all the others

        from agentrl.config import load_config

        rank = MPI.COMM_WORLD.Get_rank() - load_config(str(args.run_dir / "config.yaml")).cluster.trainer.world_size
    else:
        rank = args.rank
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(name)s %(levelname)s [rollout-{rank}] %(message)s")
    from agentrl.launch import slurm_env

    if slurm_env.job_id():
        for sig in (signal.SIGUSR1, signal.SIGTERM):  # a handler, not SIG_IGN: children must not inherit it
            signal.signal(sig, _wait_for_the_trainer)
    out = asyncio.run(amain(args.run_dir, rank, files=args.rank is not None))
    logging.getLogger("agentrl.rollout").info("rank %d done %s", rank, json.dumps(out.get("summary", {}))[:2000])


def _wait_for_the_trainer(signum: int, _frame: object) -> None:
    logging.getLogger("agentrl.rollout").info("%s: left to the trainer, whose stop notice ends this rank",
                                              signal.Signals(signum).name)


async def amain(run_dir: Path, rank: int, files: bool = False) -> dict:
    from agentrl.auth import run_secret
    from agentrl.config import load_config
    from agentrl.launch import rendezvous
    from agentrl.monitor.tensorboard import make_monitor
    from agentrl.rollout import role
    from agentrl.rollout.env_latency import maybe_slow
    from agentrl.rollout.from_config import chat_format, engine_factory
    from agentrl.rollout.model_check import check_prompts_fit
    from agentrl.rollout.spec import RolloutSpec
    from agentrl.rollout.weight_sources import BroadcastWeights, DirWeights
    from agentrl.serving.client import EnvClient
    from agentrl.transport.file_channel import FileRolloutChannel

    cfg = load_config(str(run_dir / "config.yaml"))
    r, tr = cfg.rollout, cfg.transport
    if files != (tr.channel == "files"):
        raise SystemExit(f"transport.channel={tr.channel}: " + ("pass --rank R (there is no MPI world)"
                                                                if tr.channel == "files" else
                                                                "the rank comes from the MPI world, not --rank"))
    if not 0 <= rank < cfg.cluster.rollout.ranks:
        raise SystemExit(f"rollout rank {rank} is outside 0..{cfg.cluster.rollout.ranks - 1} (cluster.rollout.ranks)")
    model_dir = Path(cfg.model.path) if cfg.model.path else run_dir / "model"
    fmt = chat_format(cfg, model_dir)  # the model's template, parser and stop tokens; bad settings fail here
    spec = RolloutSpec.from_config(cfg)
    place = role.RankPlace.from_config(cfg, rank)
    timeout = cfg.cluster.role_timeout_s

    def channel():
        if files:
            return FileRolloutChannel.connect(run_dir, rank, rendezvous.read, timeout_s=timeout, poll_s=tr.poll_s)
        from agentrl.transport.mpi_channel import MpiRolloutChannel

        return MpiRolloutChannel.world(rank, trainer=0, timeout_s=timeout)

    def weights(ch):
        if tr.weights == "broadcast":
            return BroadcastWeights(run_dir, rank, cfg.cluster.rollout.ranks, lambda: rendezvous.read(run_dir), timeout)
        return DirWeights(run_dir, tr.poll_s)

    url = rendezvous.wait_for(run_dir, "controller_url", timeout_s=120)
    monitor = make_monitor(run_dir, f"rollout-{rank}", cfg.monitor.tensorboard)
    try:
        async with EnvClient(url, keepalive_s=cfg.controller.keepalive_s, secret=run_secret(run_dir)) as env:
            client = maybe_slow(env, r.env_latency_s, r.env_latency_sigma, cfg.seed * 100 + rank)
            if rank == 0:  # before any episode: a prompt that cannot fit with a turn is a settings error, named
                await check_prompts_fit(env, fmt, spec.tasks, r.max_model_len, r.max_new_tokens)
            make_engine = engine_factory(cfg, model_dir, client, fmt, rank=rank)
            return await role.run(run_dir, client, fmt, make_engine, spec, place, monitor, channel, weights)
    finally:
        monitor.close()


if __name__ == "__main__":
    main()
