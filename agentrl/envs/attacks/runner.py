"""Play attacks through a real `EnvWorker` in this process and judge each: reward, status, worker health.

The worker is the one `jobs/env_worker.py` runs (its routes, thread pool, per-call deadline), served on
127.0.0.1 by aiohttp's test server; the attacks are HTTP requests, as a policy's calls arrive. While an
attack plays, a ticker on the event loop records how late it woke (the heartbeats run on that loop: a
stall past the controller's `dead_after_s` gets the worker declared dead).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from aiohttp.test_utils import TestClient, TestServer

from agentrl.envs.api import Task
from agentrl.envs.attacks.library import Attack
from agentrl.envs.worker import EnvWorker, create_worker_app

MAX_LAG_S = 1.0
"""The most the worker's event loop may stall during an attack (heartbeats every 5 s by default, a worker
declared dead after 15 s: a 1 s stall already means task work ran on the loop)."""


@dataclass(frozen=True)
class AttackResult:
    attack: str
    task: str
    index: str
    reward: float
    status: str
    healthy: bool
    detail: str = ""

    @property
    def held(self) -> bool:
        """No reward, no env_error (which training drops), no 5xx, and the worker stayed healthy."""
        return self.reward == 0.0 and self.status not in ("env_error", "http_error") and self.healthy


def default_index(task: Task) -> str:
    for split in ("test", "train", "dev"):
        try:
            indices = task.indices(split)
        except Exception:  # a split the task does not have
            continue
        if indices:
            return str(indices[0])
    raise ValueError(f"task {task.name!r} has no test, train or dev index")


async def _ticker(lags: list[float], stop: asyncio.Event, period_s: float = 0.05) -> None:
    while not stop.is_set():
        t = time.monotonic()
        await asyncio.sleep(period_s)
        lags.append(time.monotonic() - t - period_s)


async def _play_one(http: TestClient, worker: EnvWorker, task: Task, attack: Attack) -> AttackResult:
    index = attack.index or default_index(task)
    r = await http.post("/start_sample", json={"task": task.name, "index": index})
    if r.status != 200:
        return AttackResult(attack.name, task.name, index, 0.0, "not_started", True, (await r.text())[:200])
    start = await r.json()
    sid = start["session_id"]
    if attack.problem is not None:  # os: the sample replaced in place (the worker holds the Session)
        from agentrl.envs.tasks.os_task import OsEpisode, parse_problem

        session = worker.sessions[sid].session
        ep, problem = session.episode, parse_problem(attack.problem, None)
        try:
            session.episode = OsEpisode(problem, ep.cfg, ep.budget, getattr(task, "example_state", "start"))
        except TypeError:  # an os task of another version, without example_state
            session.episode = OsEpisode(problem, ep.cfg, ep.budget)
        ep.close()
    reward, status, detail, last = 0.0, "running", "", []
    for message in attack.messages:
        body = message(start["messages"], last) if callable(message) else message
        r = await http.post("/interact", json={"session_id": sid, "message": body})
        if r.status >= 500:
            status, detail = "http_error", f"HTTP {r.status}: {(await r.text())[:200]}"
            break
        if r.status != 200:
            detail = f"HTTP {r.status}: {(await r.text())[:120]}"
            continue
        out = await r.json()
        reward = max(reward, float(out["reward"]))
        status, last = str(out["status"]), list(out["messages"])
        if out.get("error"):
            detail = str(out["error"])[:200]
        if out["done"]:
            break
    else:
        await http.post("/cancel", json={"session_id": sid})
    return AttackResult(attack.name, task.name, index, reward, status, True, detail)


async def _healthy(http: TestClient, worker: EnvWorker, task: Task, lag: float) -> str:
    """"" when the worker is healthy after an attack, else why not."""
    deadline = time.monotonic() + 10.0
    while worker.stuck and time.monotonic() < deadline:  # a call past its deadline may still be finishing
        await asyncio.sleep(0.1)
    if lag > MAX_LAG_S:
        return f"the event loop stalled {lag:.1f} s"
    if worker.stuck:
        return f"{worker.stuck} task call(s) still stuck"
    unhealthy = getattr(worker, "unhealthy", dict)()  # a worker of another version may not report it
    if unhealthy:
        return f"reports unhealthy: {unhealthy}"
    r = await http.post("/start_sample", json={"task": task.name, "index": default_index(task)})
    if r.status != 200:
        return f"a new session does not start (HTTP {r.status})"
    await http.post("/cancel", json={"session_id": (await r.json())["session_id"]})
    return ""


async def _play(task: Task, attacks: list[Attack], call_timeout_s: float) -> list[AttackResult]:
    worker = EnvWorker({task.name: task}, slots=8, worker_id="attack-check", call_timeout_s=call_timeout_s,
                       max_body_bytes=8 << 20)
    results = []
    try:
        async with TestClient(TestServer(create_worker_app(worker))) as http:
            for attack in attacks:
                lags: list[float] = []
                stop = asyncio.Event()
                ticker = asyncio.create_task(_ticker(lags, stop))
                try:
                    result = await _play_one(http, worker, task, attack)
                except Exception as e:  # the attack broke the player itself: that is a finding, not a pass
                    result = AttackResult(attack.name, task.name, attack.index, 0.0, "http_error", True,
                                          f"{type(e).__name__}: {str(e)[:160]}")
                stop.set()
                await ticker
                why = await _healthy(http, worker, task, max(lags, default=0.0))
                if attack.after is not None:  # something of the session that outlived it (off the loop)
                    why = "; ".join(w for w in (why, await asyncio.to_thread(attack.after, task)) if w)
                if why:
                    result = AttackResult(result.attack, result.task, result.index, result.reward, result.status,
                                          False, f"{result.detail}; {why}".strip("; "))
                results.append(result)
    finally:
        worker.shutdown()
    return results


def play_attacks(task: Task, attacks: list[Attack], call_timeout_s: float = 24.0) -> list[AttackResult]:
    """Play `attacks` on `task` (one worker for them all, as on a node) and return one result each."""
    return asyncio.run(_play(task, attacks, call_timeout_s))
