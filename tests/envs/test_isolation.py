"""Sessions in processes of their own (`agentrl.serving.isolation`), through a real `EnvWorker` over HTTP:
work that holds the interpreter lock or takes memory stays in its session, ends it as the agent's failure,
and never stalls the worker's event loop or another session.

Checked to fail without the fix: with `isolation = "thread"` the regex below holds the lock in the worker
and the event loop stalls for the whole call (the worker then answers env_error at its own deadline)."""
from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from env_helpers import call

from agentrl.config import ControllerConfig, EnvsConfig
from agentrl.serving.worker import EnvWorker, create_worker_app
from agentrl.tasks.api import Action, StepResult, tool_message
from agentrl.types import Status


class HostileEpisode:
    """Tools that do what a hostile argument can make a Python tool do."""

    def __init__(self) -> None:
        self.calls = 0

    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "user", "content": "go"}]

    def step(self, action: Action) -> StepResult:
        call_ = action.tool_calls[0]
        self.calls += 1
        what = call_.arguments["what"]
        if what == "regex":  # catastrophic backtracking: C code that never lets go of the interpreter lock
            re.match(r"(a+)+$", "a" * 40 + "b")
        elif what == "memory":
            _ = b"x" * (1 << 30)
        elif what == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif what == "sleep":
            time.sleep(60)
        elif what == "spawn":  # a tool that leaves a process behind
            import subprocess

            child = subprocess.Popen(["sleep", "300"])
            return StepResult([tool_message(call_.id, call_.name, f"child {child.pid}")])
        elif what == "bug":
            raise KeyError("a broken task")
        elif what == "end":
            return StepResult([tool_message(call_.id, call_.name, "bye")], done=True, reward=1.0)
        return StepResult([tool_message(call_.id, call_.name, f"pid {os.getpid()} calls {self.calls}")])

    def expert_message(self) -> dict[str, Any]:
        return call("act", {"what": "end"})


class HostileTask:
    name = "hostile"
    max_turns = 50

    def tools(self) -> list[dict[str, Any]]:
        return [{"type": "function", "function": {"name": "act", "parameters": {
            "type": "object", "properties": {"what": {"type": "string"}}, "required": ["what"]}}}]

    def indices(self, split: str) -> list[str]:
        return [f"{split}-{i}" for i in range(10)]

    def start(self, index: str) -> HostileEpisode:
        return HostileEpisode()


def act(what: str) -> dict[str, Any]:
    return call("act", {"what": what})


async def _ticker(lags: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        t = time.monotonic()
        await asyncio.sleep(0.02)
        lags.append(time.monotonic() - t - 0.02)


def play(script: Any, call_timeout_s: float = 4.0) -> Any:
    async def main() -> Any:
        worker = EnvWorker({"hostile": HostileTask()}, EnvsConfig(slots=4, process_memory_mb=256), ControllerConfig(),
                           "w", call_timeout_s=call_timeout_s, expert_route=True)
        try:
            async with TestClient(TestServer(create_worker_app(worker))) as http:
                return await script(http, worker)
        finally:
            worker.shutdown()
    return asyncio.run(main())


async def start(http: TestClient) -> str:
    r = await http.post("/start_sample", json={"task": "hostile", "index": "train-0"})
    assert r.status == 200, await r.text()
    return str((await r.json())["session_id"])


async def interact(http: TestClient, sid: str, message: dict[str, Any]) -> dict[str, Any]:
    r = await http.post("/interact", json={"session_id": sid, "message": message})
    assert r.status == 200, await r.text()
    out: dict[str, Any] = await r.json()
    return out


def test_a_call_holding_the_interpreter_lock_ends_its_session_only() -> None:
    async def script(http: TestClient, worker: EnvWorker) -> None:
        hog, other = await start(http), await start(http)
        first = await interact(http, other, act("hello"))
        assert first["messages"][0]["content"].startswith("pid ") and f"pid {os.getpid()}" not in first["messages"][0]["content"]
        lags: list[float] = []
        stop = asyncio.Event()
        ticker = asyncio.create_task(_ticker(lags, stop))
        pending = asyncio.create_task(interact(http, hog, act("regex")))
        served = 0
        while not pending.done():  # another session is served meanwhile, in its own process
            r = await interact(http, other, act("hello"))
            assert not r["done"]
            served += 1
            await asyncio.sleep(0.1)
        out = await pending
        stop.set()
        await ticker
        assert (out["done"], out["status"], out["reward"]) == (True, "invalid_action", 0.0)
        assert out["metrics"]["over_budget"] == 1.0 and "message budget of 3 s" in out["messages"][-1]["content"]
        assert max(lags) < 0.5, max(lags)  # the event loop (heartbeats) never waited on the hog
        assert served >= 5 and worker.stuck == 0 and worker.unhealthy() == {}
        assert "calls 2" not in (await interact(http, other, act("end")))["messages"][0]["content"]
        r = await http.post("/interact", json={"session_id": hog, "message": act("hello")})
        assert r.status == 404  # its slot is free again
    play(script)


def test_memory_crashes_and_bugs_are_told_apart() -> None:
    async def script(http: TestClient, worker: EnvWorker) -> None:
        rss = _rss()
        out = await interact(http, await start(http), act("memory"))  # 1 GiB in a process capped at +256 MiB
        assert (out["status"], out["metrics"].get("over_budget")) == ("invalid_action", 1.0), out
        assert "MemoryError" in out["messages"][-1]["content"]
        assert _rss() - rss < 200 << 20  # the worker's own memory did not hold it
        out = await interact(http, await start(http), act("crash"))  # the agent's input crashed native code
        assert (out["status"], out["metrics"].get("over_budget")) == ("invalid_action", 1.0), out
        assert "SIGSEGV" in out["messages"][-1]["content"]
        out = await interact(http, await start(http), act("bug"))  # the task's own bug: the environment's failure
        assert out["status"] == "env_error" and "KeyError" in out["error"], out
        sid = await start(http)  # killed from outside (an OOM killer, an operator): not the agent's doing
        pending = asyncio.create_task(interact(http, sid, act("sleep")))
        await asyncio.sleep(0.5)
        os.kill(worker.sessions[sid].session.pid, signal.SIGKILL)  # type: ignore[union-attr]
        out = await pending
        assert out["status"] == "env_error" and "SIGKILL" in out["error"], out
    play(script, call_timeout_s=8.0)


def test_the_wire_behaves_as_for_a_session_in_the_worker() -> None:
    async def script(http: TestClient, worker: EnvWorker) -> None:
        r = await http.post("/start_sample", json={"task": "hostile", "index": "no-such"})
        assert r.status == 200  # the task accepts any index; the split is the caller's business
        sid = (await r.json())["session_id"]
        r = await http.post("/interact", json={"session_id": sid, "message": {"role": "user", "content": "x"}})
        assert r.status == 400 and "assistant message" in await r.text()  # the caller's mistake, session lives
        r = await http.post("/expert", json={"session_id": sid})
        assert r.status == 200 and (await r.json())["message"]["tool_calls"][0]["function"]["name"] == "act"
        out = await interact(http, sid, act("end"))
        assert (out["done"], out["status"], out["reward"]) == (True, "completed", 1.0)
        assert sid not in worker.sessions
        live = await start(http)
        pid = worker.sessions[live].session.pid  # type: ignore[union-attr]
        assert worker.host is not None
        for target in (worker.host.pid, pid):  # the job's SIGTERM (a drain) reaches every process of the step
            os.kill(target, signal.SIGTERM)
        await asyncio.sleep(0.2)
        assert not (await interact(http, live, act("hello")))["done"]  # the session finishes its work
        spawned = int((await interact(http, live, act("spawn")))["messages"][0]["content"].split()[1])
        r = await http.post("/cancel", json={"session_id": live})
        assert r.status == 200
        assert _gone(pid) and _gone(spawned)  # what a tool started goes with its session
    play(script)


def test_an_agent_fault_inside_a_step_is_the_agents_failure() -> None:
    """Session's verdict by whose budget ran out, in any process: an exception that says the message asked
    for too much (memory, depth, a number too long to print) is invalid_action; any other is env_error."""
    from agentrl.serving.session import Session
    from agentrl.tasks.api import BudgetExceeded

    class Raising(HostileTask):
        def __init__(self, error: BaseException) -> None:
            self.error = error

        def start(self, index: str) -> HostileEpisode:
            episode = HostileEpisode()

            def step(action: Action) -> StepResult:
                raise self.error
            episode.step = step  # type: ignore[method-assign]
            return episode

    def status(error: BaseException) -> Status:
        return Session(Raising(error), "train-0").interact(act("x")).status

    assert status(BudgetExceeded("quota")) == Status.INVALID_ACTION
    assert status(MemoryError()) == Status.INVALID_ACTION
    assert status(RecursionError()) == Status.INVALID_ACTION
    try:
        int("9" * 5000)
    except ValueError as e:
        assert status(e) == Status.INVALID_ACTION
    assert status(ValueError("a bug")) == Status.ENV_ERROR
    assert status(RuntimeError("disk on fire")) == Status.ENV_ERROR


def _rss() -> int:
    with open("/proc/self/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) << 10  # type: ignore[union-attr]


def _gone(pid: int, wait_s: float = 5.0) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{pid}/stat") as f:
            if f.read().split()[2] == "Z":  # ended, not yet reaped by the zygote
                return True
        time.sleep(0.05)
    return False
