"""Play attacks through a real `EnvWorker` in this process and judge each: reward, status, worker health.

The worker is the one `jobs/env_worker.py` runs (its routes, thread pool, per-call deadline), served on
127.0.0.1 by aiohttp's test server; the attacks are HTTP requests, as a policy's calls arrive. While an
attack plays, a ticker on the event loop records how late it woke (the heartbeats run on that loop: a
stall past the controller's `dead_after_s` gets the worker declared dead), the worker process's memory, and
what the worker's processes do to the host's disk: the free space of the temporary directories' file systems
beside what the process tree wrote and holds open (`Watch`, `disk`: free space alone counts the neighbours).
"""
from __future__ import annotations

import asyncio
import os
import re
import tempfile
import time
from dataclasses import dataclass, field

from aiohttp.test_utils import TestClient, TestServer

from agentrl.checks.attacks import disk
from agentrl.checks.attacks.attack import Attack
from agentrl.config import ControllerConfig, EnvsConfig
from agentrl.serving.worker import CALL_TIMEOUT_S, EnvWorker, create_worker_app
from agentrl.tasks.api import Task

MAX_LAG_S = 1.0
"""The most the worker's event loop may stall during an attack (heartbeats every 5 s by default, a worker
declared dead after 15 s: a 1 s stall already means task work ran on the loop)."""
MAX_RSS_GROWTH = 256 << 20
"""The most the worker process's own memory may grow during an attack (its sessions' processes aside: they
hold what their session takes, within their own bound)."""
MAX_DISK_GROWTH = 512 << 20
"""The most the worker's processes may fill the host's disk during an attack, or grow the files they hold open
(a session's database may hold 256 MB by default)."""


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


@dataclass
class Watch:
    """What the ticker saw during one attack: the event loop's lateness, the worker's memory, the disk."""

    disk_limit: int = MAX_DISK_GROWTH
    lags: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)
    free: dict[int, list[int]] = field(default_factory=dict)
    """Free bytes per file system (by device) of the temporary directories."""
    written: list[int] = field(default_factory=list)
    """What the worker's process tree wrote to storage, net (`disk.written_bytes`); empty where unaccounted."""
    held: list[int] = field(default_factory=list)
    """The bytes of the files the worker's process tree holds open (`disk.held_bytes`)."""

    def sample(self) -> None:
        self.rss.append(_rss())
        for path in TEMP_DIRS:
            try:
                st = os.statvfs(path)
                dev = os.stat(path).st_dev
            except OSError:
                continue
            self.free.setdefault(dev, []).append(st.f_bavail * st.f_frsize)
        pids = disk.tree_pids()
        if (written := disk.written_bytes(pids)) is not None:
            self.written.append(written)
        self.held.append(disk.held_bytes(pids))

    def problems(self) -> list[str]:
        out = []
        if self.lags and max(self.lags) > MAX_LAG_S:
            out.append(f"the event loop stalled {max(self.lags):.1f} s")
        if self.rss and max(self.rss) - self.rss[0] > MAX_RSS_GROWTH:
            out.append(f"the worker's memory grew by {(max(self.rss) - self.rss[0]) >> 20} MB")
        filled = max((free[0] - min(free) for free in self.free.values() if free), default=0)
        wrote = max(self.written) - self.written[0] if self.written else 0
        if not self.written and filled > self.disk_limit:  # no per-process accounting: free space is all there is
            out.append(f"{filled >> 20} MB of the host's disk were filled (by whom is unknown: this kernel "
                       "does not account I/O per process)")
        elif self.written and min(filled, wrote) > self.disk_limit:
            out.append(f"{filled >> 20} MB of the host's disk were filled while the worker's processes wrote "
                       f"{wrote >> 20} MB")
        if self.held and max(self.held) - self.held[0] > self.disk_limit:
            grown = max(self.held) - self.held[0]
            out.append(f"the files the worker's processes hold open grew by {grown >> 20} MB")
        return out


TEMP_DIRS = (tempfile.gettempdir(), "/var/tmp")


def _rss() -> int:
    try:
        with open("/proc/self/status") as f:
            found = re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M)
        return int(found.group(1)) << 10 if found else 0
    except OSError:
        return 0


async def _ticker(watch: Watch, stop: asyncio.Event, period_s: float = 0.05) -> None:
    watch.sample()
    while not stop.is_set():
        t = time.monotonic()
        await asyncio.sleep(period_s)
        watch.lags.append(time.monotonic() - t - period_s)
        if len(watch.lags) % 4 == 0:
            watch.sample()
    watch.sample()


async def _play_one(http: TestClient, worker: EnvWorker, task: Task, attack: Attack) -> AttackResult:
    index = attack.index or default_index(task)
    r = await http.post("/start_sample", json={"task": task.name, "index": index})
    if r.status != 200:
        return AttackResult(attack.name, task.name, index, 0.0, "not_started", True, (await r.text())[:200])
    start = await r.json()
    sid = start["session_id"]
    if attack.problem is not None:  # os: the sample replaced in place (the worker holds the Session)
        from agentrl.tasks.os_task import OsEpisode, parse_problem

        session = worker.sessions[sid].session
        ep, problem = session.episode, parse_problem(attack.problem, None)
        try:
            session.episode = OsEpisode(problem, ep.cfg, ep.budget, getattr(task, "example_state", "start"))
        except TypeError:  # an os task of another version, without example_state
            session.episode = OsEpisode(problem, ep.cfg, ep.budget)
        ep.close()
    reward, status, detail, last, hurt = 0.0, "running", "", [], ""
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
        acted = sum(m.get("role") == "tool" and not str(m.get("content", "")).startswith("Error") for m in last)
        if attack.max_acts and acted > attack.max_acts:
            hurt = f"{acted} calls of one message acted (at most {attack.max_acts})"
        if out["done"]:
            break
    else:
        if attack.probe is not None:  # a look from outside while the session still holds what it took
            hurt = "; ".join(w for w in (hurt, await asyncio.to_thread(attack.probe, task)) if w)
        await http.post("/cancel", json={"session_id": sid})
    if hurt:
        return AttackResult(attack.name, task.name, index, reward, status, False, f"{detail}; {hurt}".strip("; "))
    return AttackResult(attack.name, task.name, index, reward, status, True, detail)


async def _healthy(http: TestClient, worker: EnvWorker, task: Task, watch: Watch) -> str:
    """"" when the worker is healthy after an attack, else why not."""
    deadline = time.monotonic() + 10.0
    while worker.stuck and time.monotonic() < deadline:  # a call past its deadline may still be finishing
        await asyncio.sleep(0.1)
    if watch.problems():
        return "; ".join(watch.problems())
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
    worker = EnvWorker({task.name: task}, EnvsConfig(slots=8), ControllerConfig(max_body_bytes=8 << 20),
                       "attack-check", call_timeout_s=call_timeout_s)
    results = []
    try:
        async with TestClient(TestServer(create_worker_app(worker))) as http:
            for attack in attacks:
                watch = Watch()
                stop = asyncio.Event()
                ticker = asyncio.create_task(_ticker(watch, stop))
                try:
                    result = await _play_one(http, worker, task, attack)
                except Exception as e:  # the attack broke the player itself: that is a finding, not a pass
                    result = AttackResult(attack.name, task.name, attack.index, 0.0, "http_error", True,
                                          f"{type(e).__name__}: {str(e)[:160]}")
                stop.set()
                await ticker
                why = await _healthy(http, worker, task, watch)
                if attack.after is not None:  # something of the session that outlived it (off the loop)
                    why = "; ".join(w for w in (why, await asyncio.to_thread(attack.after, task)) if w)
                if why or not result.healthy:
                    result = AttackResult(result.attack, result.task, result.index, result.reward, result.status,
                                          False, f"{result.detail}; {why}".strip("; "))
                results.append(result)
    finally:
        worker.shutdown()
    return results


def play_attacks(task: Task, attacks: list[Attack], call_timeout_s: float = CALL_TIMEOUT_S) -> list[AttackResult]:
    """Play `attacks` on `task` (one worker for them all, as on a node) and return one result each."""
    return asyncio.run(_play(task, attacks, call_timeout_s))
