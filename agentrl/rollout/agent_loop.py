"""One agent loop: run one episode of one sample through the env client, recording a Trajectory.

The loop keeps the token sequence exactly as the model saw and produced it, in the model's own chat
format (`agentrl.rollout.chat`): the prompt is the chat template's, each assistant turn appends the sampled
token ids (never re-tokenized), and each observation appends the template's delta for the env messages. A
tool call the model wrote badly becomes an error observation (the model learns from it); an env failure
ends the episode as `env_error`, which the caller retries or counts, never trains on.

Whose failure an exception is, by its cause: reading the model's own text (the tool-call parser) is the
model's, so a parser that raises on it (a bug of ours, logged with its traceback and counted in
`parse_failures`) answers the turn as an unreadable call; the env's failures arrive as `EnvError`; any other
exception is our own code failing on the episode and leaves `run_episode` (`collect` records it as
`internal_error`: never trained on, never retried), except that the engine's failing is the rank's
(`EngineFailed`: its engine is gone, every episode would fail alike; the launcher restarts the rank). The
session is cancelled on every way out.
"""
from __future__ import annotations

import logging
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from agentrl.rollout.chat import ChatFormat, Transcript
from agentrl.rollout.engine import Engine, SamplingConfig
from agentrl.rollout.tool_calls import ParsedTurn, ToolCallError
from agentrl.tasks.api import EnvError
from agentrl.types import Status, Trajectory, TrajectoryBuilder, new_id

log = logging.getLogger("agentrl.rollout")


class EngineFailed(RuntimeError):
    """The engine raised on a generation: the rank's failure, not the episode's (`collect` lets it through)."""


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int
    """A global cap on assistant turns below the task's own limit (0: the task's limit alone). Episodes
    it ends early are `truncated`: the run's budget, not the agent's failure."""
    max_model_len: int
    max_new_tokens: int


STAGES = ("env_s", "generate_s", "parse_s", "render_s", "build_s", "check_s")
"""Where an episode's time goes, recorded in `Trajectory.timings` beside `total_s`: env calls (start, interact,
cancel), generation (from asking the engine to having its tokens, hand-offs included), reading tool calls
(decode + parser), the chat template (prompt and observation deltas, rendered and tokenized), the trajectory's
arrays, and the end-of-episode template check."""


class _Stages:
    """Charges the time since the previous lap to a stage, so every moment of an episode lands in one stage."""

    def __init__(self) -> None:
        self.t0 = self.t = time.perf_counter()
        self.timings = dict.fromkeys(STAGES, 0.0)

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.timings[stage] += now - self.t
        self.t = now

    def done(self) -> dict[str, float]:
        self.timings["total_s"] = time.perf_counter() - self.t0
        return self.timings


@dataclass
class Conversation:
    """An episode's messages as the loop exchanged them: the env's first `prompt` messages and `tools`, then each
    assistant message (parsed: content and tool calls; `raw` text when its calls could not be read, `finish`
    when cut at the token limit) and each observation (`by: "loop"` when the loop wrote it, not the env).
    Kept only for a caller that asks (`CONVERSATION`): jobs.eval's transcripts."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    prompt: int = 0

    def begin(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> None:
        """A new attempt's start (a retried episode's earlier attempt is dropped)."""
        self.messages, self.tools, self.prompt = list(messages), tools, len(messages)

    def add(self, messages: list[dict[str, Any]], own: bool = False) -> None:
        self.messages += [{**m, "by": "loop"} for m in messages] if own else messages


CONVERSATION: ContextVar[Conversation | None] = ContextVar("agentrl_conversation", default=None)
"""Set to a `Conversation` by a caller that wants the episode's messages (the evaluation's players); unset in
training, where the loop pays one lookup per episode for it and keeps nothing."""


# A task that does not say its round limit (an old server) gets this many turns before the cap.
DEFAULT_TASK_TURNS = 20


def turn_budget(task_max_turns: int | None, cap: int) -> tuple[int, bool]:
    """(turns this episode may take, whether reaching them means the cap cut it short of the task's limit)."""
    own = task_max_turns if task_max_turns and task_max_turns > 0 else DEFAULT_TASK_TURNS
    if cap and cap < own:
        return cap, True
    return own, False


async def run_episode(client: Any, engine: Engine, fmt: ChatFormat, task: str, index: str, group_id: str,
                      sampling: SamplingConfig, limits: EpisodeLimits) -> Trajectory:
    """Play one episode; raises EnvError only if the session could not be started, `TemplateMismatch`
    when `rollout.template_check` is strict and the episode's tokens differ from the template's, and any
    exception of our own code (module docstring); the session is cancelled whichever way it ends."""
    clock = _Stages()
    start = await client.start_sample(task, index)
    clock.lap("env_s")
    sid = start.session_id
    if (conv := CONVERSATION.get()) is not None:
        conv.begin(start.messages, start.tools)
    b = TrajectoryBuilder()
    max_turns, capped = turn_budget(start.max_turns, limits.max_turns)
    # Reaching max_turns below: the task's own limit ends the episode as turn_limit (turns with unreadable
    # calls count, as the env's Session counts every assistant message); the run's cap, as truncated.
    status = Status.TRUNCATED if capped else Status.TURN_LIMIT
    reward, metrics, turns, invalid, parse_failures = 0.0, {}, 0, 0, 0
    done = False
    try:
        talk = Transcript(fmt, start.messages, start.tools, max_prompt=limits.max_model_len)
        clock.lap("render_s")
        b.add_context(talk.prompt)  # an over-long prompt ends at once as context_limit
        while turns < max_turns:
            budget = limits.max_model_len - len(b)
            if budget < 2:
                status = Status.CONTEXT_LIMIT
                break
            clock.lap("build_s")
            s = SamplingConfig(min(limits.max_new_tokens, budget - 1), sampling.temperature, sampling.top_p,
                               sampling.stop_token_ids, sampling.seed)
            try:
                gen = await engine.generate(b.tokens, s, session_id=sid, tools=start.tools, fmt=fmt)
            except EnvError:  # the expert engine asks the env: its failure is the env's
                raise
            except Exception as e:
                raise EngineFailed(f"{type(e).__name__}: {e}") from e
            clock.lap("generate_s")
            b.add_action(gen.token_ids, gen.logprobs, gen.version, gen.engine_id)
            talk.sampled(gen.token_ids)
            turns += 1
            clock.lap("build_s")
            try:
                parsed = fmt.parse(gen.token_ids, start.tools, call_id_prefix=f"call_{turns}")
            except Exception:  # noqa: BLE001 - the model's text made our parser raise: its unreadable call
                log.exception("%s/%s: reading the model's tool calls raised (answered as an unreadable call)",
                              task, index)
                parse_failures += 1
                parsed = ParsedTurn("", [], [ToolCallError("", "the tool call could not be read")])
            clock.lap("parse_s")
            if conv is not None:
                conv.add([_said(fmt, parsed, gen.token_ids, gen.finish_reason)])
            if gen.finish_reason == "length":
                if len(b) + 1 >= limits.max_model_len:
                    status = Status.CONTEXT_LIMIT
                    break
                # The turn ran out of tokens before its end: the observation tells the model (the template's
                # turn end comes first, as context), as with any malformed call.
                if not parsed.errors:
                    parsed.errors.append(ToolCallError("", "the message was cut off at the token limit"))
            own = bool(parsed.errors)  # the rollout's own answer, not env text
            if parsed.errors:
                invalid += 1
                observation = fmt.error_observation(parsed.errors)
            else:
                message = parsed.to_message()
                clock.lap("parse_s")
                res = await client.interact(sid, message)
                clock.lap("env_s")
                if res.done:
                    done, reward, status, metrics = True, float(res.reward), Status(res.status), dict(res.metrics)
                    if conv is not None:
                        conv.add(res.messages)
                    break
                observation = res.messages
            clock.lap("parse_s")  # the error observation, when there is one
            obs_ids = talk.observation_ids(observation, own)
            clock.lap("render_s")
            if len(b) + len(obs_ids) >= limits.max_model_len:  # no room left for the next turn
                status = Status.CONTEXT_LIMIT
                break
            talk.observed(observation, obs_ids, own)
            b.add_context(obs_ids)
            if conv is not None:
                conv.add(observation, own)
    except EnvError:  # the worker died, the session expired or the controller failed: infrastructure
        status, metrics = Status.ENV_ERROR, {"env_error": 1.0}  # not `done`: cancel below frees the slot
    finally:
        clock.lap("build_s")
        if not done:
            try:
                await client.cancel(sid)
            except EnvError:
                pass
            clock.lap("env_s")
    metrics.setdefault("success", 0.0)
    metrics["invalid_calls"] = float(invalid)
    if parse_failures:
        metrics["parse_failures"] = float(parse_failures)
    metrics["template_mismatch"] = float(talk.verify(task))
    clock.lap("check_s")
    traj = b.build(traj_id=new_id(), task=task, index=index, group_id=group_id, reward=reward,
                   status=status, num_turns=turns, timings=clock.timings, metrics=metrics)
    clock.lap("build_s")
    traj.timings = clock.done()  # the total includes building the trajectory
    return traj


def _said(fmt: ChatFormat, parsed: ParsedTurn, ids: list[int], finish_reason: str) -> dict[str, Any]:
    """A sampled turn as a `Conversation` message: the parsed message, the raw text where calls were unreadable."""
    message = parsed.to_message()
    if parsed.errors:
        message["raw"] = fmt.decode(ids)
    if finish_reason == "length":
        message["finish"] = "length"
    return message
