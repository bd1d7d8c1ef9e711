"""The trainer role: warm start on expert demonstrations, then GRPO/PPO steps on the rollout's shards,
publishing weights v<N> after each step (synchronous schedule).

    python -m jobs.trainer --run-dir runs/demo                # started for you by `python -m jobs.train`
    srun --het-group=0 python -m jobs.trainer --run-dir $RUN_DIR
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

from agentrl.config import load_config
from agentrl.monitor.tensorboard import make_monitor
from agentrl.trainer import role
from agentrl.trainer.step import RLHyper


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True, type=Path)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = load_config(str(args.run_dir / "config.yaml"))
    t, a = cfg.trainer, cfg.algo
    hyper = RLHyper(a.adv_estimator, a.task_norm, a.eps_low, a.eps_high, a.dual_clip, a.kl_coef, a.kl_estimator,
                    a.entropy_coef, a.eps, cfg.rollout.temperature, t.grad_clip, t.micro_batch_tokens)
    schedule = role.Schedule(
        steps=t.steps, sft_steps=t.sft_steps, sft_batch=t.sft_batch, sft_lr=t.sft_lr, sft_all_tokens=t.sft_all_tokens,
        lr=t.lr, weight_decay=t.weight_decay, max_staleness=a.max_staleness, drop_uniform_groups=a.drop_uniform_groups,
        fail_penalty=a.fail_penalty, wait_timeout_s=cfg.cluster.role_timeout_s, seed=t.seed,
        poll_s=cfg.transport.poll_s)
    model_dir = Path(cfg.model.path) if cfg.model.path else args.run_dir / "model"
    monitor = make_monitor(args.run_dir, "trainer", cfg.monitor.tensorboard)
    try:
        role.run(args.run_dir, model_dir, schedule, hyper, t.threads, monitor)
    finally:
        monitor.close()


if __name__ == "__main__":
    main()
