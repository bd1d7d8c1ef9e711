"""The controller and env worker entry points as real processes against a temp run dir."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agentrl.config import config_from_dict, dump_config
from agentrl.envs.client import GatewayClient
from agentrl.launch import rendezvous
from agentrl.types import Status

REPO = Path(__file__).resolve().parents[2]


def spawn(module: str, *args: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with log.open("wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, env=env,
                                stdout=out, stderr=subprocess.STDOUT)


def test_controller_and_worker_processes(tmp_path: Path) -> None:
    cfg = config_from_dict({"controller": {"heartbeat_s": 0.1, "dead_after_s": 1.0}, "envs": {"slots": 16}})
    dump_config(cfg, tmp_path / "config.yaml")
    procs = [spawn("jobs.controller", "--run-dir", str(tmp_path), log=tmp_path / "controller.log")]
    try:
        url = rendezvous.wait_for(tmp_path, "controller_url", timeout_s=20.0)
        procs.append(spawn("jobs.env_worker", "--run-dir", str(tmp_path), "--worker-id", "w0",
                           log=tmp_path / "worker.log"))

        async def episodes() -> list[tuple[float, Status]]:
            async with GatewayClient(url) as env:
                deadline = time.monotonic() + 20.0
                while not [w for w in (await env.status())["workers"] if w["alive"]]:
                    assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()
                    await asyncio.sleep(0.05)
                out = []
                for index in (await env.indices("lookup", "test"))[:5]:
                    start = await env.start_sample("lookup", index)
                    while True:
                        r = await env.interact(start.session_id, await env.expert(start.session_id))
                        if r.done:
                            out.append((r.reward, r.status))
                            break
                return out

        assert asyncio.run(episodes()) == [(1.0, Status.COMPLETED)] * 5
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=10) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert "registered w0" in (tmp_path / "worker.log").read_text()
