"""The players of an evaluation: a local model through the rollout's own agent loop, an endpoint through the
message-level loop (`endpoint`), each retrying env failures as the rollout does.

A local model is played by `role.collect` (one request per call: the runner bounds the concurrency and
writes each episode as it ends), so it goes through exactly what training evaluates with: `run_episode`,
the model's `ChatFormat`, the rollout's retries of env errors. An endpoint episode is retried with the same
`Retry` policy and the same fatal codes.
"""
from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Any

from agentrl.evaluation.endpoint import Reply, play_endpoint_episode
from agentrl.evaluation.played import Played
from agentrl.rollout.agent_loop import CONVERSATION, Conversation, EpisodeLimits
from agentrl.rollout.chat import ChatFormat
from agentrl.rollout.collect import FATAL_CODES, Retry, collect
from agentrl.rollout.engine import Engine, SamplingConfig
from agentrl.tasks.api import EnvError
from agentrl.types import Status

log = logging.getLogger("agentrl.evaluation")


class LocalPlayer:
    """A model served in this process (`VLLMEngine`, or an `EnginePool` for cross-sampling) in its own
    chat format; `sampling.seed` should be None when runs are sampled, or every run draws the same tokens."""

    def __init__(self, client: Any, engine: Engine, fmt: ChatFormat, sampling: SamplingConfig,
                 limits: EpisodeLimits, retry: Retry) -> None:
        self.client, self.engine, self.fmt = client, engine, fmt
        self.sampling, self.limits, self.retry = sampling, limits, retry

    async def play(self, task: str, index: str, group: str) -> Played:
        conv = Conversation()  # the agent loop fills it (its last attempt's messages): the transcript
        token = CONVERSATION.set(conv)
        try:
            (traj,), _ = await collect(self.client, self.engine, self.fmt, [(task, index, group)], self.sampling,
                                       self.limits, 1, self.retry)
        finally:
            CONVERSATION.reset(token)
        return Played.of_trajectory(traj, conv if conv.prompt or conv.messages else None)


class EndpointPlayer:
    """An OpenAI-compatible endpoint (`endpoint.ChatEndpoint` or anything with its `reply`)."""

    def __init__(self, client: Any, endpoint: Any, temperature: float, top_p: float, limits: EpisodeLimits,
                 retry: Retry) -> None:
        self.client, self.endpoint = client, endpoint
        self.temperature, self.top_p, self.limits, self.retry = temperature, top_p, limits, retry

    async def play(self, task: str, index: str, group: str) -> Played:
        return await play_retrying(lambda: play_endpoint_episode(
            self.client, self.endpoint, task, index, self.temperature, self.top_p, self.limits), self.retry,
            f"{task}/{index}")


_session: contextvars.ContextVar[str] = contextvars.ContextVar("expert_session")


class ExpertPlayer:
    """Each task's scripted expert, played through the message-level loop: its replies are what the controller's
    expert route answers for the episode's session (the route must be on: `services.eval_config(expert=True)`).

    It scores the env and its grader with no model in the way (BFCL: its ground truth replayed, graded by
    bfcl-eval's checker), at the endings, retries and tables of any other target. The loop sees the client
    and the policy separately; the session the expert must answer for is the one this episode's
    `start_sample` opened, kept in a context variable (each episode runs in its own asyncio task).
    """

    def __init__(self, client: Any, limits: EpisodeLimits, retry: Retry) -> None:
        self.client, self.limits, self.retry = client, limits, retry

    def __getattr__(self, name: str) -> Any:  # interact, cancel, ...: the wrapped client's
        return getattr(self.client, name)

    async def start_sample(self, task: str, index: str) -> Any:
        start = await self.client.start_sample(task, index)
        _session.set(start.session_id)
        return start

    async def reply(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], max_tokens: int,
                    temperature: float, top_p: float) -> Reply:
        message = await self.client.expert(_session.get())
        return Reply(message, "tool_calls" if message.get("tool_calls") else "stop", 0, 0)

    async def play(self, task: str, index: str, group: str) -> Played:
        return await play_retrying(lambda: play_endpoint_episode(self, self, task, index, 0.0, 1.0, self.limits),
                                   self.retry, f"{task}/{index}")


async def play_retrying(play: Any, retry: Retry, what: str) -> Played:
    """`play()` until it ends other than in an env error, at most `retry.max_retries` more times; a session
    that could not start for want of capacity waits (up to `retry.capacity_wait_s`) without spending a retry.
    The last env_error is returned as it is (it is reported, never dropped); fatal codes raise."""
    attempt, waited = 0, 0.0
    loop = asyncio.get_running_loop()
    played: Played | None = None
    while True:
        try:
            played = await play()
        except EnvError as e:
            if e.code in FATAL_CODES:
                raise
            played = None
            if e.code == "no_capacity" and waited < retry.capacity_wait_s:
                t0 = loop.time()
                await asyncio.sleep(retry.delay(min(attempt, 4)))
                waited += loop.time() - t0
                continue
            log.warning("start_sample %s failed (%s): attempt %d", what, e, attempt + 1)
        if played is not None and played.status != Status.ENV_ERROR:
            return played
        if attempt >= retry.max_retries:
            break
        await asyncio.sleep(retry.delay(attempt))
        attempt += 1
    return played or Played(Status.ENV_ERROR, 0.0, 0.0, 0, 0, 0, 0.0, {"env_error": 1.0, "success": 0.0})
