"""The rollout role: many concurrent agent loops, generating with vLLM, against the env controller.

    python -m jobs.rollout --run-dir runs/demo                # started for you by `python -m jobs.train`
    srun --het-group=1 python -m jobs.rollout --run-dir $RUN_DIR
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
from pathlib import Path

from agentrl.auth import run_secret
from agentrl.config import load_config
from agentrl.envs.client import GatewayClient
from agentrl.envs.tasks import task_name
from agentrl.launch import rendezvous
from agentrl.monitor.tensorboard import make_monitor
from agentrl.rollout import role
from agentrl.rollout.agent_loop import EpisodeLimits
from agentrl.rollout.engine import ExpertEngine


async def amain(run_dir: Path) -> None:
    from transformers import AutoTokenizer

    cfg = load_config(str(run_dir / "config.yaml"))
    r = cfg.rollout
    model_dir = Path(cfg.model.path) if cfg.model.path else run_dir / "model"
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    plan = role.Plan(
        tasks=tuple(task_name(t) for t in cfg.envs.tasks), steps=cfg.trainer.steps, prompts_per_step=r.prompts_per_step,
        samples_per_prompt=r.samples_per_prompt, expert_samples=r.expert_samples if cfg.trainer.sft_steps else 0,
        eval_split=r.eval_split, eval_samples=r.eval_samples, eval_sampled=r.eval_sampled, concurrency=r.concurrency,
        temperature=r.temperature, top_p=r.top_p,
        limits=EpisodeLimits(r.max_turns, r.max_model_len, r.max_new_tokens),
        retry=role.Retry(max_retries=r.env_retries, capacity_wait_s=r.env_wait_s),
        wait_timeout_s=cfg.cluster.role_timeout_s, seed=cfg.seed, poll_s=cfg.transport.poll_s,
    )

    url = rendezvous.wait_for(run_dir, "controller_url", timeout_s=120)
    monitor = make_monitor(run_dir, "rollout", cfg.monitor.tensorboard)
    try:
        async with GatewayClient(url, keepalive_s=cfg.controller.keepalive_s, secret=run_secret(run_dir)) as client:

            def make_engine():
                if r.engine == "expert":  # the task's scripted expert plays every episode (pipeline checks)
                    return ExpertEngine(client, tok)
                from agentrl.rollout.engine import VLLMEngine

                return VLLMEngine(str(model_dir), r.max_model_len, max_num_seqs=r.concurrency,
                                  kv_cache_gib=r.kv_cache_gib, seed=cfg.seed)

            summary = await role.run(run_dir, model_dir, client, tok, make_engine, plan, monitor)
    finally:
        monitor.close()
    logging.getLogger("agentrl.rollout").info("summary %s", json.dumps(summary))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True, type=Path)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(amain(args.run_dir))


if __name__ == "__main__":
    main()
