"""Episodes against an OpenAI-compatible chat endpoint with tool calling, at the message level.

The rollout's agent loop (`agentrl.rollout.agent_loop`) works on token ids in the model's own chat format;
an endpoint (vLLM's OpenAI server, a hosted model) takes messages and tools and returns an assistant message
whose tool calls it has already parsed. `play_endpoint_episode` is that loop at the message level, beside
the token-level one and with the same endings:

    start_sample → chat.completions(messages, tools) → interact(assistant message) → ... until the env ends it

  * the task's round limit, or the run's cap below it (`truncated`), as `turn_budget` decides;
  * a reply cut at the token limit: `context_limit` when the conversation has reached `max_model_len`,
    else an error observation that says so (the env never sees a half-written call);
  * the endpoint refusing a request as too long for its context: `context_limit`;
  * an env failure (`EnvError`): `env_error`, the session cancelled; the caller retries.

A call the server could not parse comes back as plain content; when that content tried a call (a family's
call marker, `unread_call_observation`), the turn is answered with the error observation the local path
gives it, without the env, so that both paths score a model's malformed calls alike; content without a
tried call goes to the env, which answers it as any message without a call.
Not here: retries (`players.EndpointPlayer`) and token-level fidelity (an endpoint re-renders the whole
conversation from messages every turn; our local path never re-tokenizes what was sampled).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from agentrl.evaluation.played import Played
from agentrl.rollout.agent_loop import Conversation, EpisodeLimits, turn_budget
from agentrl.rollout.tool_calls import unread_call_observation
from agentrl.tasks.api import EnvError
from agentrl.tasks.json_args import clean_text
from agentrl.types import Status

CUT_OFF = "Error: the message was cut off at the token limit."


@dataclass(frozen=True)
class Reply:
    """One assistant turn from the endpoint: the message to send the env, and what it cost."""

    message: dict[str, Any]
    finish_reason: str  # "stop" | "tool_calls" | "length"
    prompt_tokens: int
    completion_tokens: int


class ContextTooLong(Exception):
    """The endpoint refused the request: the conversation no longer fits its context."""


class ChatEndpoint:
    """`chat.completions` of an OpenAI-compatible server (openai's async client), tools in the request.

    Args:
        base_url: e.g. http://127.0.0.1:8000/v1.
        model: the served model's name.
        api_key: the key (a local vLLM server takes any).
        timeout_s: per request.
    """

    def __init__(self, base_url: str, model: str, api_key: str = "none", timeout_s: float = 600.0) -> None:
        import openai

        self.model = model
        self._openai = openai
        self._client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key or "none", timeout=timeout_s,
                                          max_retries=2)

    async def reply(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], max_tokens: int,
                    temperature: float, top_p: float) -> Reply:
        try:
            resp = await self._client.chat.completions.create(
                model=self.model, messages=messages, tools=tools or self._openai.NOT_GIVEN,
                max_tokens=max_tokens, temperature=temperature, top_p=top_p)
        except self._openai.BadRequestError as e:
            if "context" in str(e).lower() or "too long" in str(e).lower():
                raise ContextTooLong(str(e)) from e
            raise
        choice = resp.choices[0]
        msg: dict[str, Any] = {"role": "assistant", "content": choice.message.content or ""}
        calls = [{"id": c.id, "type": "function",
                  "function": {"name": c.function.name, "arguments": c.function.arguments}}
                 for c in choice.message.tool_calls or []]
        if calls:
            msg["tool_calls"] = calls
        usage = resp.usage
        return Reply(msg, str(choice.finish_reason), int(usage.prompt_tokens) if usage else 0,
                     int(usage.completion_tokens) if usage else 0)

    async def close(self) -> None:
        await self._client.close()


def _texts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Env messages with unpaired surrogates replaced (an endpoint's client encodes requests as UTF-8)."""
    return [{**m, "content": clean_text(m["content"])} if isinstance(m.get("content"), str) else m for m in messages]


async def play_endpoint_episode(client: Any, endpoint: Any, task: str, index: str, temperature: float,
                                top_p: float, limits: EpisodeLimits) -> Played:
    """One episode of (task, index) with `endpoint.reply` writing every assistant turn; raises EnvError only
    when the session could not be started (as `run_episode` does)."""
    t_start = time.perf_counter()
    start = await client.start_sample(task, index)
    sid = start.session_id
    messages = _texts(start.messages)
    conv = Conversation()  # what `messages` holds, the loop's own observations marked: the transcript
    conv.begin(messages, start.tools)
    max_turns, capped = turn_budget(start.max_turns, limits.max_turns)
    status = Status.TRUNCATED if capped else Status.TURN_LIMIT
    reward, metrics, turns, tokens, context = 0.0, {}, 0, 0, 0
    done = False
    try:
        while turns < max_turns:
            try:
                r = await endpoint.reply(messages, start.tools, limits.max_new_tokens, temperature, top_p)
            except ContextTooLong:
                status = Status.CONTEXT_LIMIT
                break
            turns += 1
            tokens += r.completion_tokens
            context = r.prompt_tokens + r.completion_tokens
            messages.append(r.message)
            conv.add([{**r.message, "finish": "length"} if r.finish_reason == "length" else r.message])
            if r.finish_reason == "length":
                if context + 1 >= limits.max_model_len:
                    status = Status.CONTEXT_LIMIT
                    break
                observation, own = [{"role": "user", "content": CUT_OFF}], True
            elif "tool_calls" not in r.message and (error := unread_call_observation(r.message["content"])):
                observation, own = [{"role": "tool", "content": error}], True
            else:
                res = await client.interact(sid, r.message)
                if res.done:
                    done, reward, status, metrics = True, float(res.reward), Status(res.status), dict(res.metrics)
                    conv.add(_texts(res.messages))
                    break
                observation, own = _texts(res.messages), False
            messages += observation
            conv.add(observation, own)
    except EnvError:
        status, metrics = Status.ENV_ERROR, {"env_error": 1.0}
    finally:
        if not done:
            try:
                await client.cancel(sid)
            except EnvError:
                pass
    metrics.setdefault("success", 0.0)
    return Played(status=status, reward=reward, success=float(metrics["success"]), turns=turns, tokens=tokens,
                  context_tokens=context, wall_s=time.perf_counter() - t_start, metrics=metrics, conversation=conv)
