"""The per-run secret (agentrl/auth.py) and the routes that require it, over real sockets on 127.0.0.1.

Forged calls (no secret, a wrong one) to every controller and worker route get 401 and change nothing:
the tests compare the registry and the worker's state before and after. The run's own clients work.
"""
from __future__ import annotations

import asyncio
import copy
import os
import stat
import threading
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aio_helpers import run, wait_until

from agentrl.auth import ENV_VAR, SecretError, authorized, run_secret
from agentrl.config import ControllerConfig, EnvsConfig, load_config
from agentrl.serving.client import EnvClient
from agentrl.serving.controller.server import start_controller
from agentrl.serving.process import expert_route_on
from agentrl.serving.worker import start_worker
from agentrl.tasks.api import EnvError
from agentrl.types import Status

SECRET = "s3cret-of-this-run"
CFG = ControllerConfig(heartbeat_s=0.05, dead_after_s=2.0, session_idle_s=30.0, keepalive_s=1.0)
ENVS = EnvsConfig(tasks=("lookup",), slots=8)


# ------------------------------------------------------------------------- the secret itself

def test_secret_is_made_once_owner_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    first = run_secret(tmp_path)
    assert len(first) == 64 and run_secret(tmp_path) == first
    assert stat.S_IMODE((tmp_path / "secret").stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["secret"]  # no temporary file left behind
    monkeypatch.setenv(ENV_VAR, "from-the-environment")
    assert run_secret(tmp_path) == "from-the-environment"


def test_roles_racing_to_make_it_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    got: list[str] = []
    threads = [threading.Thread(target=lambda: got.append(run_secret(tmp_path))) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 16 and len(set(got)) == 1


def test_unsafe_secrets_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    run_secret(tmp_path)
    os.chmod(tmp_path / "secret", 0o644)
    with pytest.raises(SecretError, match="accessible to other users"):
        run_secret(tmp_path)
    monkeypatch.setenv(ENV_VAR, "two words\r\nX-Injected: 1")
    with pytest.raises(SecretError, match="printable ASCII"):
        run_secret(tmp_path)


def test_header_check() -> None:
    assert authorized(SECRET, f"Bearer {SECRET}")
    assert not authorized(SECRET, None) and not authorized(SECRET, SECRET)
    assert not authorized(SECRET, f"Bearer {SECRET}x") and not authorized(SECRET, "Bearer ")


def test_serving_without_a_secret_only_on_loopback() -> None:
    with pytest.raises(ValueError, match="without a run secret"):
        run(start_controller(ControllerConfig(host="0.0.0.0")))  # type: ignore[arg-type]


@pytest.mark.parametrize(("preset", "overrides", "on"), [
    ("demo", [], True),  # the warm start plays the expert
    ("smoke", [], True),
    ("demo", ["trainer.warm_start_steps=0"], False),
    ("demo", ["trainer.warm_start_steps=0", "rollout.engine=expert"], True),
    ("demo", ["envs.expert_route=disabled"], False),
    ("demo", ["trainer.warm_start_steps=0", "envs.expert_route=enabled"], True),
])
def test_expert_route_follows_the_run(preset: str, overrides: list[str], on: bool) -> None:
    assert expert_route_on(load_config(preset, overrides)) is on


# ------------------------------------------------------------------------- forged calls

async def post(url: str, body: dict[str, Any], secret: str | None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    async with aiohttp.ClientSession(headers=headers) as http, http.post(url, json=body) as resp:
        return resp.status, await resp.json(content_type=None)


async def get(url: str, secret: str | None) -> int:
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    async with aiohttp.ClientSession(headers=headers) as http, http.get(url) as resp:
        return resp.status


def snapshot(ctrl: Any) -> dict[str, Any]:
    reg = ctrl.controller.registry
    return copy.deepcopy({"workers": {w.worker_id: w.to_wire() | {"sessions": sorted(w.sessions)}
                                      for w in reg.workers.values()},
                          "sessions": sorted(reg.sessions), "tombstones": sorted(reg.tombstones)})


@pytest.mark.parametrize("forged", [None, "not-the-secret"])
def test_forged_calls_get_401_and_change_nothing(forged: str | None) -> None:
    async def main() -> None:
        ctrl = await start_controller(CFG, secret=SECRET)
        worker = await start_worker(ENVS, CFG, ctrl.url, "w0", secret=SECRET, expert_route=True)
        await wait_until(lambda: "w0" in ctrl.controller.registry.workers)
        async with EnvClient(ctrl.url, secret=SECRET) as env:
            start = await env.start_sample("lookup", "train-0")
            sid = start.session_id
            before, held = snapshot(ctrl), dict(worker.worker.sessions)
            attacks = [
                (ctrl.url, "/register", {"worker_id": "w0", "address": "http://127.0.0.1:9", "tasks": ["lookup"],
                                         "slots": 1, "sessions": []}),
                (ctrl.url, "/heartbeat", {"worker_id": "w0", "active": 0, "draining": True}),
                (ctrl.url, "/drain", {"worker_id": "w0"}),
                (ctrl.url, "/expert", {"session_id": sid}),
                (ctrl.url, "/interact", {"session_id": sid, "message": {"role": "assistant", "content": "x"}}),
                (ctrl.url, "/cancel", {"session_id": sid}),
                (ctrl.url, "/start_sample", {"task": "lookup", "index": "train-1"}),
                (ctrl.url, "/touch", {"session_ids": [sid]}),
                (worker.address, "/start_sample", {"task": "lookup", "index": "train-1"}),
                (worker.address, "/expert", {"session_id": sid}),
                (worker.address, "/interact", {"session_id": sid, "message": {"role": "assistant", "content": "x"}}),
                (worker.address, "/cancel", {"session_id": sid}),
                (worker.address, "/drain", {}),
            ]
            for base, route, body in attacks:
                status, answer = await post(base + route, body, forged)
                assert (status, answer["error"]["code"]) == (401, "unauthorized"), (base, route, answer)
            for url in (f"{ctrl.url}/status", f"{ctrl.url}/indices?task=lookup&split=train", f"{worker.address}/status",
                        f"{worker.address}/indices?task=lookup&split=train"):
                assert await get(url, forged) == 401, url
            await asyncio.sleep(3 * CFG.heartbeat_s)  # the real heartbeats go on meanwhile
            after = snapshot(ctrl)
            for w in (before, after):
                w["workers"]["w0"].pop("reported_active")
            assert after == before and not after["workers"]["w0"]["draining"]
            assert dict(worker.worker.sessions) == held and not worker.worker.draining
            assert worker.worker.counters["unauthorized"] == 7  # the 5 posts and 2 gets sent to it
            status = await env.status()
            assert status["unauthorized"] == 10 and status["errors"] == 0
            # the run's own client is served as before: the session plays to its reward
            while True:
                r = await env.interact(sid, await env.expert(sid))
                if r.done:
                    assert (r.reward, r.status) == (1.0, Status.COMPLETED)
                    break
        await worker.stop()
        await ctrl.stop()
    run(main())


def test_expert_route_is_off_unless_the_run_enables_it() -> None:
    async def main() -> None:
        ctrl = await start_controller(CFG, secret=SECRET)
        worker = await start_worker(ENVS, CFG, ctrl.url, "w0", secret=SECRET)  # envs.expert_route: auto → off
        await wait_until(lambda: "w0" in ctrl.controller.registry.workers)
        async with EnvClient(ctrl.url, secret=SECRET) as env, \
                EnvClient(worker.address, secret=SECRET, keepalive_s=None) as direct:
            start = await env.start_sample("lookup", "train-0")
            for client in (env, direct):
                with pytest.raises(EnvError) as e:
                    await client.expert(start.session_id)
                assert e.value.code == "forbidden" and "envs.expert_route" in e.value.message
            r = await env.interact(start.session_id, {"role": "assistant", "content": "hmm"})
            assert not r.done  # the session is unharmed
            assert (await env.status())["errors"] == 0
        await worker.stop()
        await ctrl.stop()
    run(main())
