"""The controller and env worker entry points as real processes against a temp run dir."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agentrl.auth import run_secret
from agentrl.config import config_from_dict, dump_config
from agentrl.launch import rendezvous
from agentrl.serving.client import EnvClient
from agentrl.tasks.api import EnvError
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
            async with EnvClient(url, secret=run_secret(tmp_path)) as env:
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

        async def forged() -> str:
            async with EnvClient(url, secret="not-this-run") as env:
                try:
                    await env.status()
                except EnvError as e:
                    return e.code
                return "served"

        assert asyncio.run(forged()) == "unauthorized"  # the roles made and share RUN_DIR/secret, owner-only
        assert (tmp_path / "secret").stat().st_mode & 0o777 == 0o600
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=10) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert "registered w0" in (tmp_path / "worker.log").read_text()


def test_killed_worker_process_costs_only_its_sessions(tmp_path: Path) -> None:
    """kill -9 on one worker process mid-run ends its sessions as env_error and nothing else; a worker
    joining mid-run takes new sessions; SIGTERM drains a worker: its held sessions still finish."""
    cfg = config_from_dict({"controller": {"heartbeat_s": 0.1, "dead_after_s": 1.0}, "envs": {"slots": 4}})
    dump_config(cfg, tmp_path / "config.yaml")
    procs = {"controller": spawn("jobs.controller", "--run-dir", str(tmp_path), log=tmp_path / "controller.log")}

    def add_worker(wid: str) -> None:
        procs[wid] = spawn("jobs.env_worker", "--run-dir", str(tmp_path), "--worker-id", wid,
                           log=tmp_path / f"{wid}.log")

    async def workers(env: EnvClient, alive: set[str]) -> dict[str, dict]:
        deadline = time.monotonic() + 20.0
        while True:
            ws = {w["worker_id"]: w for w in (await env.status())["workers"]}
            if {wid for wid, w in ws.items() if w["alive"]} == alive:
                return ws
            assert time.monotonic() < deadline, (alive, ws)
            await asyncio.sleep(0.05)

    async def play(env: EnvClient, sid: str) -> tuple[float, Status]:
        while True:
            try:
                message = await env.expert(sid)
            except EnvError as e:  # the owning worker is gone: the session says so from now on
                assert e.code == "env_error"
                message = {"role": "assistant", "content": ""}
            r = await env.interact(sid, message)
            if r.done:
                return r.reward, r.status

    async def scenario() -> None:
        async with EnvClient(url, secret=run_secret(tmp_path)) as env:
            await workers(env, {"w0", "w1"})
            starts = [await env.start_sample("lookup", f"test-{i}") for i in range(4)]
            owner = {s.session_id: w for s, w in zip(starts, ["w0", "w1", "w0", "w1"])}
            assert (await env.status())["sessions"] == {"lookup": 4}
            procs["w1"].kill()  # SIGKILL: no goodbye
            procs["w1"].wait()
            results = {sid: await play(env, sid) for sid in owner if owner[sid] == "w1"}
            assert set(results.values()) == {(0.0, Status.ENV_ERROR)}
            ws = await workers(env, {"w0"})
            assert ws["w0"]["active"] == 2  # w0's sessions were never touched
            add_worker("w2")  # joins mid-run, and takes the new sessions (most free slots)
            await workers(env, {"w0", "w2"})
            late = await env.start_sample("lookup", "test-9")
            assert (await env.status())["workers"][2]["active"] == 1
            assert await play(env, late.session_id) == (1.0, Status.COMPLETED)
            procs["w0"].send_signal(signal.SIGTERM)  # drain: no new sessions, the held ones finish
            deadline = time.monotonic() + 10.0
            while not {w["worker_id"]: w for w in (await env.status())["workers"]}["w0"]["draining"]:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            assert procs["w0"].poll() is None
            for sid in [s for s in owner if owner[s] == "w0"]:
                assert await play(env, sid) == (1.0, Status.COMPLETED)
            assert await asyncio.to_thread(procs["w0"].wait, 10) == 0
            status = await env.status()
            assert status["active_sessions"] == 0 and status["errors"] == 2

    try:
        url = rendezvous.wait_for(tmp_path, "controller_url", timeout_s=20.0)
        add_worker("w0")
        add_worker("w1")
        asyncio.run(asyncio.wait_for(scenario(), 60.0))
        for name in ("w2", "controller"):
            procs[name].send_signal(signal.SIGTERM)
            assert procs[name].wait(timeout=10) == 0
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    assert "draining 2 sessions" in (tmp_path / "w0.log").read_text()
