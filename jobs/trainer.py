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

from agentrl.config import RunConfig, load_config
from agentrl.launch import slurm_env
from agentrl.launch.preempt import Preemption
from agentrl.monitor.tensorboard import make_monitor
from agentrl.trainer import role
from agentrl.trainer.parallel import Parallel, close_distributed, dist_env, init_distributed
from agentrl.trainer.step import RLHyper


def plan(cfg: RunConfig) -> tuple[role.Schedule, RLHyper]:
    """The trainer's slices of the run config: its schedule and the update's hyper-parameters."""
    t, a = cfg.trainer, cfg.algo
    hyper = RLHyper.from_config(a, t, cfg.rollout.temperature)
    schedule = role.Schedule(
        steps=t.steps, sft_steps=t.sft_steps, sft_batch=t.sft_batch, sft_lr=t.sft_lr, sft_all_tokens=t.sft_all_tokens,
        lr=t.lr, weight_decay=t.weight_decay, max_staleness=a.max_staleness, drop_uniform_groups=a.drop_uniform_groups,
        fail_penalty=a.fail_penalty, wait_timeout_s=cfg.cluster.role_timeout_s, seed=cfg.seed + t.seed,
        poll_s=cfg.transport.poll_s, warmup_steps=t.warmup_steps, checkpoint_every=t.checkpoint_every,
        keep_checkpoints=t.keep_checkpoints, sft_successful_only=t.sft_successful_only, sft_target=t.sft_target,
        sft_min_token_prob=t.sft_min_token_prob, sft_check_every=t.sft_check_every, sft_holdout=t.sft_holdout,
        update=t.update)
    return schedule, hyper


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True, type=Path)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = load_config(str(args.run_dir / "config.yaml"))
    schedule, hyper = plan(cfg)
    model_dir = Path(cfg.model.path) if cfg.model.path else args.run_dir / "model"

    env = dist_env()
    par = Parallel(cfg.trainer.parallel, env, init_distributed(env), cfg.trainer.mixed_precision)
    monitor = make_monitor(args.run_dir, "trainer", cfg.monitor.tensorboard, rank=par.rank)
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
