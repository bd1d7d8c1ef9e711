"""The trainer role: warm start on expert demonstrations, then GRPO/PPO steps on the rollout's shards,
publishing weights v<N> after each step (synchronous schedule) and checkpointing every few steps. A
restarted trainer resumes from the newest checkpoint in the run dir.

    python -m jobs.trainer --run-dir runs/demo                # started for you by `python -m jobs.train`
    torchrun --nproc-per-node 2 -m jobs.trainer --run-dir runs/demo     # 2 data-parallel ranks
    srun --het-group=0 python -m jobs.trainer --run-dir $RUN_DIR        # needs MASTER_ADDR/MASTER_PORT

Ranks come from RANK/WORLD_SIZE (torchrun) or SLURM_PROCID/SLURM_NTASKS; trainer.parallel picks DDP or
FSDP2 (NCCL on GPUs, gloo on CPU). Through submitit, `submitit.helpers.TorchDistributedEnvironment`
exports the same variables.
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

from agentrl.config import load_config
from agentrl.launch import slurm_env
from agentrl.launch.preempt import Preemption
from agentrl.monitor.tensorboard import make_monitor, write_config
from agentrl.trainer import role
from agentrl.trainer.from_config import plan
from agentrl.trainer.parallel import Parallel, close_distributed, dist_env, init_distributed


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True, type=Path)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = load_config(str(args.run_dir / "config.yaml"))
    schedule, hyper = plan(cfg)
    model_dir = Path(cfg.model.path) if cfg.model.path else args.run_dir / "model"

    env = dist_env()
    device = init_distributed(env, timeout_s=cfg.cluster.trainer.collective_timeout)  # < the job's time limit
    par = Parallel(cfg.trainer.parallel, env, device, cfg.trainer.mixed_precision)
    monitor = make_monitor(args.run_dir, "trainer", cfg.monitor.tensorboard, rank=par.rank)
    write_config(monitor, cfg)  # the resolved config as text at step 0 (rank 0's monitor; a null one elsewhere)
    # Under Slurm the job's warning signal (USR1) and SIGTERM mean: finish the step, checkpoint, requeue.
    # Outside Slurm a SIGTERM keeps its plain meaning (the local launcher stops or restarts the role).
    preemption = Preemption().install() if slurm_env.job_id() else None
    try:
        role.run(args.run_dir, model_dir, schedule, hyper, cfg.trainer.threads, monitor, par,
                 should_stop=(lambda: preemption.requested) if preemption else None)
    finally:
        monitor.close()
        close_distributed()
    if preemption is not None and preemption.requested:
        preemption.exit_for_requeue()


if __name__ == "__main__":
    main()
