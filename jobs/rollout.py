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
from agentrl.launch import rendezvous
from agentrl.monitor.tensorboard import make_monitor
from agentrl.rollout import role
from agentrl.rollout.env_latency import maybe_slow
from agentrl.rollout.from_config import chat_format, engine_factory, make_plan


async def amain(run_dir: Path) -> None:
    cfg = load_config(str(run_dir / "config.yaml"))
    r = cfg.rollout
    model_dir = Path(cfg.model.path) if cfg.model.path else run_dir / "model"
    fmt = chat_format(cfg, model_dir)  # the model's template, parser and stop tokens; bad settings fail here
    plan = make_plan(cfg)

    url = rendezvous.wait_for(run_dir, "controller_url", timeout_s=120)
    monitor = make_monitor(run_dir, "rollout", cfg.monitor.tensorboard)
    try:
        async with GatewayClient(url, keepalive_s=cfg.controller.keepalive_s, secret=run_secret(run_dir)) as gateway:
            client = maybe_slow(gateway, r.env_latency_s, r.env_latency_sigma, cfg.seed)  # off unless configured
            make_engine = engine_factory(cfg, model_dir, client, fmt)
            summary = await role.run(run_dir, model_dir, client, fmt, make_engine, plan, monitor)
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
