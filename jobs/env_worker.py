"""Env worker role: host the configured tasks' sessions for the controller, until SIGTERM/SIGINT.

Locally (after the controller has published its address in the run dir):
    python -m jobs.env_worker --run-dir runs/demo --worker-id w0
Under Slurm (one task per worker; inside Apptainer where tasks need a sandbox):
    srun --het-group=2 --ntasks=$WORKERS python -m jobs.env_worker --run-dir $RUN_DIR
Through submitit, the launcher calls `main(["--run-dir", run_dir, "--worker-id", id])`.

Waits for `controller_url` in RUN_DIR/rendezvous.json, serves `envs.tasks` with `envs.slots` slots on
a free port, registers and heartbeats. The worker id defaults to worker-$SLURM_PROCID or host-pid.
Every route requires the run's secret ($AGENTRL_SECRET, else RUN_DIR/secret, made here if absent);
/expert answers only where the run turns it on (`envs.expert_route`, auto: when the run plays the expert).
SIGTERM drains: no new sessions, up to `envs.drain_s` for the held ones to end, then exit; a second
SIGTERM (or SIGINT) exits at once.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
from pathlib import Path
from urllib.parse import urlparse

from agentrl.auth import run_secret
from agentrl.config import load_config
from agentrl.launch import rendezvous
from agentrl.serving.process import event_loop_factory, expert_route_on, raise_fd_limit
from agentrl.serving.worker import start_worker

log = logging.getLogger("agentrl.jobs.env_worker")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def default_worker_id() -> str:
    if "SLURM_PROCID" in os.environ:
        return f"worker-{os.environ.get('SLURM_JOB_ID', 'job')}-{os.environ['SLURM_PROCID']}"
    return f"worker-{socket.gethostname()}-{os.getpid()}"


async def serve(run_dir: Path, worker_id: str, host: str | None, advertise: str | None, wait_s: float) -> int:
    """Serve until a signal; returns how many task calls are still running (past their deadline)."""
    cfg = load_config(str(run_dir / "config.yaml"))
    controller_url = await asyncio.to_thread(rendezvous.wait_for, run_dir, "controller_url", wait_s)
    # a controller on loopback means one machine: stay on loopback; otherwise listen everywhere and
    # advertise this node's name
    local = urlparse(controller_url).hostname in LOOPBACK
    host = host or ("127.0.0.1" if local else "0.0.0.0")
    advertise = advertise or ("127.0.0.1" if local else socket.gethostname())
    running = await start_worker(cfg.envs, cfg.controller, controller_url, worker_id, host=host,
                                 advertise_host=advertise, secret=run_secret(run_dir),
                                 expert_route=expert_route_on(cfg))
    log.info("worker %s serving %s at %s (controller %s)", worker_id, list(cfg.envs.tasks), running.address,
             controller_url)

    stop, now = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        if stop.is_set() or sig == signal.SIGINT:
            now.set()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    await stop.wait()
    if not now.is_set() and cfg.envs.drain_s > 0:
        log.info("worker %s draining %d sessions (up to %gs)", worker_id, len(running.worker.sessions),
                 cfg.envs.drain_s)
        drain = asyncio.create_task(running.drain(cfg.envs.drain_s))
        interrupt = asyncio.create_task(now.wait())
        await asyncio.wait([drain, interrupt], return_when=asyncio.FIRST_COMPLETED)
        interrupt.cancel()
        drain.cancel()
    log.info("worker %s stopping with %d sessions held", worker_id, len(running.worker.sessions))
    await running.stop()
    return running.worker.stuck


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--worker-id", default=None)
    parser.add_argument("--host", default=None, help="interface to bind (default: by controller address)")
    parser.add_argument("--advertise", default=None, help="host name the controller calls back")
    parser.add_argument("--wait-s", type=float, default=600.0, help="how long to wait for the controller")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    raise_fd_limit()
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        stuck = runner.run(serve(args.run_dir, args.worker_id or default_worker_id(), args.host, args.advertise,
                                 args.wait_s))
    if stuck:  # threads of hung task calls cannot be stopped, and interpreter exit would join them
        log.warning("exiting with %d task calls still running", stuck)
        logging.shutdown()
        os._exit(0)


if __name__ == "__main__":
    main()
