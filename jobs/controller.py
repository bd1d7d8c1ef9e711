"""Env controller role: serve the session routes the rollout calls, until SIGTERM/SIGINT.

Locally (the run dir must hold config.yaml):
    python -m jobs.controller --run-dir runs/demo
Under Slurm (its own het group, one task, one core is enough):
    srun --het-group=2 --ntasks=1 python -m jobs.controller --run-dir $RUN_DIR
Through submitit, the launcher calls `main(["--run-dir", run_dir])`.

Reads RUN_DIR/config.yaml, serves on controller.host:controller.port (port 0 picks a free one), then
publishes `controller_url` in RUN_DIR/rendezvous.json for the workers and the rollout to find. Every
route requires the run's secret ($AGENTRL_SECRET, else RUN_DIR/secret, made here if absent). Every
monitor.controller_stats_s seconds it logs its own statistics (sessions, errors by class, p50/p99
latency: `agentrl.serving.controller.stats`) to RUN_DIR/tb.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
from pathlib import Path

from agentrl.auth import run_secret
from agentrl.config import load_config
from agentrl.launch import rendezvous
from agentrl.monitor.tensorboard import make_monitor
from agentrl.serving.controller.server import start_controller
from agentrl.serving.controller.stats import log_periodically
from agentrl.serving.process import event_loop_factory, raise_fd_limit
from agentrl.tasks import task_name

log = logging.getLogger("agentrl.jobs.controller")


async def serve(run_dir: Path) -> None:
    cfg = load_config(str(run_dir / "config.yaml"))
    # bound to every interface: advertise this node's name, which the other nodes can resolve
    advertise = socket.gethostname() if cfg.controller.host in ("0.0.0.0", "::", "") else None
    running = await start_controller(cfg.controller, advertise_host=advertise, secret=run_secret(run_dir))
    rendezvous.publish(run_dir, controller_url=running.url)
    log.info("controller serving at %s", running.url)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    period = cfg.monitor.controller_stats_s
    # TensorBoard's own writer, not torch's: the controller never imports torch (seconds of a stalled loop)
    monitor = make_monitor(run_dir, "controller", cfg.monitor.tensorboard and period > 0, torch=False)
    stats = asyncio.create_task(log_periodically(running.controller.status_dict, monitor, period,
                                                 tuple(task_name(t) for t in cfg.envs.tasks))) if period else None
    await stop.wait()
    log.info("controller stopping")
    if stats is not None:
        stats.cancel()
        await asyncio.gather(stats, return_exceptions=True)
    monitor.close()
    await running.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    raise_fd_limit()
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(serve(args.run_dir))


if __name__ == "__main__":
    main()
