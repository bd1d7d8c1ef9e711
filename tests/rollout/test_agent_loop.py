"""The agent loop against a real controller and env worker on loopback sockets, with a scripted engine:
token bookkeeping, malformed calls as observations, limits, and env failures."""
from __future__ import annotations

import asyncio
import json

import numpy as np

from agentrl.config import RunConfig
from agentrl.models import tiny_chat as chat
from agentrl.rollout.agent_loop import EpisodeLimits, run_episode, turn_budget
from agentrl.rollout.collect import collect
from agentrl.rollout.engine import ExpertEngine, SamplingConfig
from agentrl.serving.client import EnvClient
from agentrl.serving.controller.server import start_controller
from agentrl.serving.worker import start_worker
from agentrl.tasks.lookup import make_sample
from agentrl.types import Status
from tests.rollout.scripted_engine import ScriptedEngine

INDEX = "test-3"


def call(tool: str, **args: str) -> str:
    return f'{chat.CALL_START}{{"name": "{tool}", "arguments": {json.dumps(args)}}}{chat.CALL_END}{chat.IM_END}'


async def _with_env(fn, cfg: RunConfig | None = None):
    cfg = cfg or RunConfig()
    controller = await start_controller(cfg.controller)
    worker = await start_worker(cfg.envs, cfg.controller, controller.url, "worker-test", expert_route=True)
    client = EnvClient(controller.url)
    try:
        for _ in range(200):
            if (await client.status())["workers"]:
                break
            await asyncio.sleep(0.02)
        return await fn(client, worker)
    finally:
        await client.close()
        await worker.stop()
        await controller.stop()


def _sampling(fmt) -> SamplingConfig:
    return SamplingConfig(48, 1.0, 1.0, fmt.stop_ids)


def test_episode_tokens_masks_and_reward(lookup_format) -> None:
    fmt = lookup_format
    tok = fmt.tokenizer
    s = make_sample(INDEX)
    replies = [call("lookup", name=s.target, field=s.field), call("submit_answer", answer=s.answer)]
    engine = ScriptedEngine(replies, tok)

    async def go(client, _):
        return await run_episode(client, engine, fmt, "lookup", INDEX, "g0", _sampling(fmt), EpisodeLimits(4, 512, 48))

    t = asyncio.run(_with_env(go))
    assert t.status == Status.COMPLETED and t.reward == 1.0 and t.metrics["success"] == 1.0
    assert t.num_turns == 2 and t.metrics["invalid_calls"] == 0
    # the action tokens are exactly the engine's replies, in order, with the engine's log-probs/version/id
    action_ids = t.tokens[t.loss_mask == 1].tolist()
    assert action_ids == [i for r in replies for i in tok.encode(r, add_special_tokens=False)]
    assert np.all(t.logprobs[t.loss_mask == 1] == -1.0) and np.all(t.logprobs[t.loss_mask == 0] == 0.0)
    assert set(t.policy_version[t.loss_mask == 1].tolist()) == {3} and set(t.engine[t.loss_mask == 1].tolist()) == {7}
    assert set(t.policy_version[t.loss_mask == 0].tolist()) == {-1}
    # what the model saw at its second turn is a prefix of the trajectory, and holds the tool result
    second_prompt = engine.prompts[1]
    assert t.tokens[: len(second_prompt)].tolist() == second_prompt
    seen = tok.decode(second_prompt)
    assert f"<|im_start|>tool\n{s.answer}<|im_end|>" in seen and seen.endswith("<|im_start|>assistant\n")


def test_malformed_call_becomes_an_observation_and_the_episode_goes_on(lookup_format) -> None:
    fmt = lookup_format
    tok = fmt.tokenizer
    s = make_sample(INDEX)
    replies = ['<tool_call>{"name": "lookup", "arguments": {"name": </tool_call><|im_end|>',
               call("lookup", name="nobody", field="code"),
               call("submit_answer", answer=s.answer)]
    engine = ScriptedEngine(replies, tok)

    async def go(client, _):
        return await run_episode(client, engine, fmt, "lookup", INDEX, "g0", _sampling(fmt), EpisodeLimits(4, 512, 48))

    t = asyncio.run(_with_env(go))
    assert t.status == Status.COMPLETED and t.reward == 1.0
    assert t.metrics["invalid_calls"] == 1 and t.num_turns == 3
    text = tok.decode(t.tokens.tolist())
    assert "Error: tool call is not valid JSON" in text  # our parser's observation
    assert "Error: no item named 'nobody'" in text  # the task's own observation


def test_the_tasks_own_turn_limit_ends_the_episode_and_cancels(lookup_format) -> None:
    """No global cap (max_turns 0): lookup's own limit of 4 turns applies, told by start_sample."""
    fmt = lookup_format
    tok = fmt.tokenizer
    engine = ScriptedEngine([call("lookup", name="nobody", field="code")] * 4, tok)

    async def go(client, _):
        start = await client.start_sample("lookup", INDEX)
        await client.cancel(start.session_id)
        t = await run_episode(client, engine, fmt, "lookup", INDEX, "g0", _sampling(fmt), EpisodeLimits(0, 512, 48))
        return start, t, await client.status()

    start, t, status = asyncio.run(_with_env(go))
    assert start.max_turns == 4
    assert t.status == Status.TURN_LIMIT and t.num_turns == 4 and t.reward == 0.0
    assert sum(status["sessions"].values()) == 0  # the session was ended, not leaked


def test_a_global_cap_below_the_tasks_limit_truncates_and_cancels(lookup_format) -> None:
    fmt = lookup_format
    tok = fmt.tokenizer
    engine = ScriptedEngine([call("lookup", name="nobody", field="code")] * 2, tok)

    async def go(client, _):
        t = await run_episode(client, engine, fmt, "lookup", INDEX, "g0", _sampling(fmt), EpisodeLimits(2, 512, 48))
        return t, await client.status()

    t, status = asyncio.run(_with_env(go))
    assert t.status == Status.TRUNCATED and t.num_turns == 2 and t.reward == 0.0
    assert not t.status.is_agent_failure and not t.status.is_infra  # counted, trained without the penalty
    assert sum(status["sessions"].values()) == 0


def test_turn_budget() -> None:
    assert turn_budget(8, 0) == (8, False)  # the task's own limit
    assert turn_budget(8, 20) == (8, False)  # a cap above it changes nothing
    assert turn_budget(8, 3) == (3, True)  # a cap below it truncates
    assert turn_budget(None, 0) == (20, False)  # a server that does not say: a default, not forever


def test_context_limit(lookup_format) -> None:
    fmt = lookup_format
    tok = fmt.tokenizer
    engine = ScriptedEngine(["x" * 400 + chat.IM_END], tok)

    async def go(client, _):
        return await run_episode(client, engine, fmt, "lookup", INDEX, "g0", _sampling(fmt), EpisodeLimits(4, 96, 64))

    t = asyncio.run(_with_env(go))
    assert t.status == Status.CONTEXT_LIMIT and t.num_tokens <= 96


def test_expert_collection_through_the_controller(lookup_format) -> None:
    fmt = lookup_format

    async def go(client, _):
        idx = (await client.indices("lookup", "test"))[:20]
        reqs = [("lookup", i, f"g{i}") for i in idx]
        return await collect(client, ExpertEngine(client), fmt, reqs, _sampling(fmt), EpisodeLimits(4, 512, 48), 8, 1)

    trajs, retries = asyncio.run(_with_env(go))
    assert len(trajs) == 20 and retries == 0
    assert all(t.status == Status.COMPLETED and t.reward == 1.0 for t in trajs)
    assert len({t.traj_id for t in trajs}) == 20


def test_dead_worker_gives_env_error_trajectories_not_crashes(lookup_format) -> None:
    fmt = lookup_format
    tok = fmt.tokenizer
    s = make_sample(INDEX)

    class KillAfterFirstTurn(ScriptedEngine):
        worker = None

        async def generate(self, prompt_ids, sampling, **context):
            if len(self.prompts) == 1:
                await self.worker.stop()
            return await super().generate(prompt_ids, sampling, **context)

    engine = KillAfterFirstTurn([call("lookup", name=s.target, field=s.field),
                                 call("submit_answer", answer=s.answer)], tok)

    async def go(client, worker):
        engine.worker = worker
        return await collect(client, engine, fmt, [("lookup", INDEX, "g")], _sampling(fmt),
                             EpisodeLimits(4, 512, 48), 1, max_retries=0)

    (t,), retries = asyncio.run(_with_env(go))
    assert t.status == Status.ENV_ERROR and t.status.is_infra and retries == 0
