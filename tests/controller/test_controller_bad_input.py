"""Bad input, one test each, over real sockets on 127.0.0.1 (controller, workers and a misbehaving fake
worker in this process): each gives the caller a clear error or the model an error observation, and
every test ends by checking that the controller still serves a healthy episode to everyone else."""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest
from aio_helpers import run, wait_until
from aiohttp import web

from agentrl.config import ControllerConfig, EnvsConfig
from agentrl.serving.client import EnvClient
from agentrl.serving.controller.server import RunningController, start_controller
from agentrl.serving.worker import RunningWorker, start_worker
from agentrl.tasks.api import Action, EnvError, StepResult, tool_message
from agentrl.tasks.lookup import LookupTask
from agentrl.types import Status

CFG = ControllerConfig(heartbeat_s=0.05, dead_after_s=2.0, session_idle_s=30.0, keepalive_s=1.0,
                       request_timeout_s=0.5, max_worker_failures=2, max_body_bytes=64 * 1024)
ENVS = EnvsConfig(tasks=("lookup", "trouble"), slots=16, max_argument_bytes=512, max_output_chars=1000,
                  expert_route="enabled")


class TroubleEpisode:
    """Tools that misbehave on request: `dump` prints too much, `crash` raises, `finish` ends."""

    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "user", "content": "make trouble"}]

    def step(self, action: Action) -> StepResult:
        call = action.tool_calls[0]
        if call.name == "crash":
            raise RuntimeError("disk on fire")
        if call.name == "finish":
            return StepResult([tool_message(call.id, call.name, "bye")], done=True, reward=1.0)
        return StepResult([tool_message(call.id, call.name, "x" * call.arguments["n"])])

    def expert_message(self) -> dict[str, Any]:
        raise RuntimeError("no expert here")


class TroubleTask:
    name = "trouble"
    max_turns = 50

    def tools(self) -> list[dict[str, Any]]:
        def tool(name: str, props: dict[str, Any]) -> dict[str, Any]:
            return {"type": "function", "function": {"name": name, "parameters": {
                "type": "object", "properties": props, "required": list(props), "additionalProperties": False}}}
        return [tool("dump", {"n": {"type": "integer", "minimum": 0}}), tool("crash", {}), tool("finish", {})]

    def indices(self, split: str) -> list[str]:
        return [f"{split}-{i}" for i in range(10)]

    def start(self, index: str) -> TroubleEpisode:
        if index == "train-9":
            raise RuntimeError("cannot load sample 9")
        return TroubleEpisode()


def call(name: str, arguments: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}]}


async def stack(cfg: ControllerConfig = CFG) -> tuple[RunningController, RunningWorker]:
    ctrl = await start_controller(cfg)
    worker = await start_worker(ENVS, cfg, ctrl.url, "w0", tasks={"lookup": LookupTask(), "trouble": TroubleTask()})
    await wait_until(lambda: "w0" in ctrl.controller.registry.workers)
    return ctrl, worker


async def still_serving(env: EnvClient) -> None:
    """A healthy lookup episode, start to reward, through the same controller."""
    start = await env.start_sample("lookup", "test-7")
    while True:
        result = await env.interact(start.session_id, await env.expert(start.session_id))
        if result.done:
            assert (result.reward, result.status) == (1.0, Status.COMPLETED)
            return


def nonzero(counts: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in counts.items() if v}


async def error_code(awaitable: Any) -> str:
    with pytest.raises(EnvError) as e:
        await awaitable
    return e.value.code


async def post_raw(url: str, data: bytes) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.post(url, data=data) as resp:
        return resp.status, await resp.json(content_type=None)


# ------------------------------------------------------------------------- the model's mistakes

@pytest.mark.parametrize(("what", "message", "says"), [
    ("malformed JSON", call("lookup", '{"name": "ka'), "Error: arguments are not valid JSON"),
    ("unknown tool", call("rm_rf", "{}"), "Error: unknown tool 'rm_rf'"),
    ("schema failure", call("lookup", '{"name": "kapa", "field": "colour"}'), "Error: invalid arguments for lookup"),
    ("not an object", call("lookup", "[1]"), "Error: arguments must be a JSON object"),
    ("oversized arguments", call("lookup", json.dumps({"name": "a" * 600, "field": "code"})),
     "Error: arguments are too long"),
    ("no tool call", {"role": "assistant", "content": "hmm"}, "Please call one of the tools"),
])
def test_malformed_tool_calls_are_observations(what: str, message: dict[str, Any], says: str) -> None:
    async def main() -> None:
        ctrl, worker = await stack()
        async with EnvClient(ctrl.url) as env:
            start = await env.start_sample("lookup", "train-0")
            r = await env.interact(start.session_id, message)
            assert not r.done and r.status == Status.RUNNING, what
            assert r.messages[0]["content"].startswith(says), r.messages
            # the episode goes on: the expert still wins it in the turns left
            while not r.done:
                r = await env.interact(start.session_id, await env.expert(start.session_id))
            assert (r.reward, r.status) == (1.0, Status.COMPLETED)
            await still_serving(env)
        await worker.stop()
        await ctrl.stop()
    run(main())


def test_oversized_output_is_cut_with_a_marker() -> None:
    async def main() -> None:
        ctrl, worker = await stack()
        async with EnvClient(ctrl.url) as env:
            start = await env.start_sample("trouble", "train-0")
            r = await env.interact(start.session_id, call("dump", '{"n": 50000}'))
            content = r.messages[0]["content"]
            assert not r.done and content.startswith("x" * 1000)
            assert content.endswith("[... 49000 more characters cut]") and len(content) < 1100
            r = await env.interact(start.session_id, call("dump", '{"n": 1000}'))
            assert r.messages[0]["content"] == "x" * 1000  # at the limit: untouched
            await still_serving(env)
        await worker.stop()
        await ctrl.stop()
    run(main())


# ------------------------------------------------------------------------- the caller's mistakes

def test_malformed_and_oversized_requests_get_clear_errors() -> None:
    async def main() -> None:
        ctrl, worker = await stack()
        async with EnvClient(ctrl.url) as env:
            start = await env.start_sample("lookup", "train-0")
            sid = start.session_id
            cases = [
                (b"{not json", 400, "invalid JSON"),
                (b"[" * 20_000 + b"]" * 20_000, 400, "invalid JSON"),  # nested past the parser's recursion limit
                (b"[1, 2]", 400, "must be a JSON object"),
                (json.dumps({"message": {}}).encode(), 400, "session_id"),
                (json.dumps({"session_id": sid, "message": "hi"}).encode(), 400, "message"),
                (json.dumps({"session_id": sid, "message": {"content": "x" * 100_000}}).encode(), 413, ""),
            ]
            for body, status, says in cases:
                got, answer = await post_raw(f"{ctrl.url}/interact", body)
                assert got == status and answer["error"]["code"] == "bad_request", (body[:40], got, answer)
                assert says in answer["error"]["message"], answer
            assert await error_code(env.interact(sid, {"role": "user", "content": "hi"})) == "bad_request"
            assert await error_code(env.start_sample("lookup", "train-x")) == "bad_request"
            assert await error_code(env.start_sample("nosuchtask", "train-0")) == "unknown_task"
            # none of it touched the session: it plays to the end
            r = await env.interact(sid, await env.expert(sid))
            r = await env.interact(sid, await env.expert(sid))
            assert (r.done, r.reward) == (True, 1.0)
            await still_serving(env)
        await worker.stop()
        await ctrl.stop()
    run(main())


def test_unknown_and_expired_sessions() -> None:
    async def main() -> None:
        cfg = ControllerConfig(heartbeat_s=0.05, dead_after_s=2.0, session_idle_s=0.3, keepalive_s=0.1)
        ctrl, worker = await stack(cfg)
        async with EnvClient(ctrl.url, keepalive_s=None) as env:
            say = {"role": "assistant", "content": ""}
            assert await error_code(env.interact("no-such-session", say)) == "unknown_session"
            assert await error_code(env.cancel("no-such-session")) == "unknown_session"
            assert await error_code(env.expert("no-such-session")) == "unknown_session"
            start = await env.start_sample("lookup", "train-0")
            await wait_until(lambda: start.session_id not in ctrl.controller.registry.sessions)
            r = await env.interact(start.session_id, say)  # expired: an ending, every time it is asked
            assert (r.done, r.status, r.reward) == (True, Status.ENV_ERROR, 0.0) and "idle" in (r.error or "")
            assert (await env.interact(start.session_id, say)).status == Status.ENV_ERROR
            assert await error_code(env.expert(start.session_id)) == "env_error"
            assert await env.touch([start.session_id, "no-such-session"]) == [start.session_id, "no-such-session"]
            await env.cancel(start.session_id)  # cancelling an ended session is fine
            await wait_until(lambda: not worker.worker.sessions)  # and its worker slot was freed
            await still_serving(env)
        await worker.stop()
        await ctrl.stop()
    run(main())


# ------------------------------------------------------------------------- the task's failures

def test_raising_task_ends_only_its_episode() -> None:
    async def main() -> None:
        ctrl, worker = await stack()
        async with EnvClient(ctrl.url) as env:
            other = await env.start_sample("trouble", "train-1")
            start = await env.start_sample("trouble", "train-0")
            r = await env.interact(start.session_id, call("crash", "{}"))
            assert (r.done, r.status, r.reward) == (True, Status.ENV_ERROR, 0.0)
            assert r.messages[-1]["content"] == "Error: the environment failed (RuntimeError: disk on fire)."
            assert await error_code(env.start_sample("trouble", "train-9")) == "env_error"  # start raised
            assert await error_code(env.expert(other.session_id)) == "env_error"  # the expert raised
            r = await env.interact(other.session_id, call("finish", "{}"))  # the other episode is fine
            assert (r.done, r.reward, r.status) == (True, 1.0, Status.COMPLETED)
            await still_serving(env)
            status = await env.status()  # the crashed episode and the failed start, once each
            assert nonzero(status["errors_by_class"]) == {"env_error": 1, "start_failed": 1}
        await worker.stop()
        await ctrl.stop()
    run(main())


# ------------------------------------------------------------------------- a worker's failures

class FakeWorker:
    """A worker that registers and heartbeats like a real one, then answers by the sample's index:
    "text-*" with a 200 that is not JSON, "shape-*" with JSON that is not an answer, "crash-*" with a
    plain-text 500, "hang-*" never; "badstart-*" already garbles start_sample."""

    def __init__(self, controller_url: str, worker_id: str = "fake") -> None:
        self.controller_url = controller_url
        self.worker_id = worker_id
        self.address = ""
        self.calls = 0
        self.runner: web.AppRunner | None = None
        self.beat: asyncio.Task[None] | None = None

    async def start_sample(self, request: web.Request) -> web.Response:
        index = (await request.json())["index"]
        if index.startswith("badstart"):
            return web.json_response({"session": 1})
        return web.json_response({"session_id": f"fake-{index}", "messages": [{"role": "user", "content": "hi"}],
                                  "tools": []})

    async def interact(self, request: web.Request) -> web.Response:
        self.calls += 1
        mode = (await request.json())["session_id"].removeprefix("fake-").split("-")[0]
        if mode == "hang":
            await asyncio.sleep(3600)
        if mode == "text":
            return web.Response(text="<html>all good</html>")
        if mode == "shape":
            return web.json_response([1, 2, 3])
        return web.Response(text="Internal Server Error", status=500)

    async def ok(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def start(self) -> None:
        app = web.Application()
        app.add_routes([web.post("/start_sample", self.start_sample), web.post("/interact", self.interact),
                        web.post("/cancel", self.ok)])
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.address = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        self.http = aiohttp.ClientSession()
        async with self.http.post(f"{self.controller_url}/register", json={
                "worker_id": self.worker_id, "address": self.address, "tasks": ["flaky"], "slots": 8}) as resp:
            assert resp.status == 200
        self.beat = asyncio.create_task(self._beat())

    async def _beat(self) -> None:
        while True:
            async with self.http.post(f"{self.controller_url}/heartbeat", json={"worker_id": self.worker_id}):
                pass
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        assert self.beat is not None and self.runner is not None
        self.beat.cancel()
        await asyncio.gather(self.beat, return_exceptions=True)
        await self.http.close()
        await self.runner.cleanup()


@pytest.mark.parametrize("mode", ["text", "shape", "crash"])
def test_worker_answering_garbage_costs_only_its_sessions(mode: str) -> None:
    async def main() -> None:
        ctrl, worker = await stack()
        fake = FakeWorker(ctrl.url)
        await fake.start()
        async with EnvClient(ctrl.url) as env:
            a = await env.start_sample("flaky", f"{mode}-0")
            b = await env.start_sample("flaky", f"{mode}-1")
            c = await env.start_sample("flaky", f"{mode}-2")
            healthy = await env.start_sample("lookup", "train-3")
            r = await env.interact(a.session_id, call("x", "{}"))
            assert (r.done, r.status, r.reward) == (True, Status.ENV_ERROR, 0.0), r
            assert "worker fake" in (r.error or "") and ("malformed" in r.error or "non-JSON" in r.error)
            assert (await env.interact(a.session_id, call("x", "{}"))).status == Status.ENV_ERROR
            reg = ctrl.controller.registry
            assert reg.workers["fake"].alive and reg.workers["fake"].failures == 1
            r = await env.interact(b.session_id, call("x", "{}"))  # the second failure in a row: dead
            assert r.status == Status.ENV_ERROR and not reg.workers["fake"].alive
            r = await env.interact(c.session_id, call("x", "{}"))  # its last session ended with it
            assert r.status == Status.ENV_ERROR and "fake" in (r.error or "") and fake.calls == 2
            assert await error_code(env.start_sample("flaky", "text-3")) == "no_capacity"
            r = await env.interact(healthy.session_id, await env.expert(healthy.session_id))
            assert not r.done  # the real worker's session never noticed
            await still_serving(env)
            status = await env.status()  # three sessions ended, each counted once, by what ended it
            assert nonzero(status["errors_by_class"]) == {"worker_garbled": 2, "worker_died": 1}
            assert status["errors"] == 3
        await fake.stop()
        await worker.stop()
        await ctrl.stop()
    run(main())


def test_garbled_start_sample_is_env_error() -> None:
    async def main() -> None:
        ctrl, worker = await stack()
        fake = FakeWorker(ctrl.url)
        await fake.start()
        async with EnvClient(ctrl.url) as env:
            assert await error_code(env.start_sample("flaky", "badstart-0")) == "env_error"
            assert ctrl.controller.registry.workers["fake"].failures == 1
            assert not ctrl.controller.registry.sessions
            await still_serving(env)
        await fake.stop()
        await worker.stop()
        await ctrl.stop()
    run(main())


def test_hanging_worker_costs_only_its_session() -> None:
    cfg = ControllerConfig(heartbeat_s=0.05, dead_after_s=5.0, session_idle_s=30.0, keepalive_s=1.0,
                           request_timeout_s=2.0, max_worker_failures=2)

    async def main() -> None:
        ctrl, worker = await stack(cfg)
        fake = FakeWorker(ctrl.url)
        await fake.start()
        async with EnvClient(ctrl.url) as env:
            hung = await env.start_sample("flaky", "hang-0")
            t0 = time.perf_counter()
            hang = asyncio.create_task(env.interact(hung.session_id, call("x", "{}")))
            for _ in range(2):  # everyone else is served while the hung call waits
                await still_serving(env)
            assert not hang.done() and time.perf_counter() - t0 < cfg.request_timeout_s
            r = await hang
            assert time.perf_counter() - t0 >= cfg.request_timeout_s
            assert (r.done, r.status) == (True, Status.ENV_ERROR) and "timed out" in (r.error or "")
            assert ctrl.controller.registry.workers["fake"].alive  # one timeout: suspect, not dead
            await still_serving(env)
            assert nonzero((await env.status())["errors_by_class"]) == {"worker_timeout": 1}
        await fake.stop()
        await worker.stop()
        await ctrl.stop()
    run(main())


# ------------------------------------------------------------------------- counting each failure once

def test_a_timeout_that_kills_the_worker_is_counted_once() -> None:
    """The timed-out session counts as worker_timeout, the other session of the now dead worker as
    worker_died: two failures, two counts (the timed-out one was once counted again as a death)."""
    cfg = ControllerConfig(heartbeat_s=0.05, dead_after_s=5.0, session_idle_s=30.0, keepalive_s=1.0,
                           request_timeout_s=1.0, max_worker_failures=1)

    async def main() -> None:
        ctrl, worker = await stack(cfg)
        fake = FakeWorker(ctrl.url)
        await fake.start()
        async with EnvClient(ctrl.url) as env:
            hung, other = await env.start_sample("flaky", "hang-0"), await env.start_sample("flaky", "hang-1")
            r = await env.interact(hung.session_id, call("x", "{}"))
            assert (r.done, r.status) == (True, Status.ENV_ERROR) and "timed out" in (r.error or "")
            assert not ctrl.controller.registry.workers["fake"].alive
            r = await env.interact(other.session_id, call("x", "{}"))
            assert r.status == Status.ENV_ERROR and "died" in (r.error or "")
            status = await env.status()
            assert nonzero(status["errors_by_class"]) == {"worker_timeout": 1, "worker_died": 1}
            assert status["errors"] == 2
        await fake.stop()
        await worker.stop()
        await ctrl.stop()
    run(main())


def test_missed_heartbeats_count_their_sessions() -> None:
    cfg = ControllerConfig(heartbeat_s=0.05, dead_after_s=0.5, session_idle_s=30.0, keepalive_s=1.0)

    async def main() -> None:
        ctrl, worker = await stack(cfg)
        fake = FakeWorker(ctrl.url)
        await fake.start()
        async with EnvClient(ctrl.url) as env:
            for i in range(3):
                await env.start_sample("flaky", f"hang-{i}")
            assert fake.beat is not None
            fake.beat.cancel()  # silent from now on
            await wait_until(lambda: not ctrl.controller.registry.workers["fake"].alive, timeout_s=10.0)
            assert nonzero((await env.status())["errors_by_class"]) == {"worker_died": 3}
        await fake.stop()
        await worker.stop()
        await ctrl.stop()
    run(main())


def test_a_bug_in_a_handler_is_500_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a body that is not JSON is "invalid JSON" (400, the caller's); a ValueError of our own code
    is a 500 internal error, logged and counted."""
    async def main() -> None:
        ctrl, worker = await stack()

        def broken(session_ids: list[str], now: float) -> list[str]:
            raise ValueError("a bug of ours")

        monkeypatch.setattr(ctrl.controller.registry, "touch", broken)
        async with EnvClient(ctrl.url) as env:
            status, answer = await post_raw(f"{ctrl.url}/touch", json.dumps({"session_ids": ["a"]}).encode())
            assert (status, answer["error"]["code"]) == (500, "internal") and "a bug of ours" in answer["error"]["message"]
            status, answer = await post_raw(f"{ctrl.url}/touch", b"{not json")
            assert (status, answer["error"]["code"]) == (400, "bad_request")
            counts = await env.status()
            assert nonzero(counts["errors_by_class"]) == {"internal": 1} and counts["errors"] == 1
        await worker.stop()
        await ctrl.stop()
    run(main())
