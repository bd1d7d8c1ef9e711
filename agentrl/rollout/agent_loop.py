"""One agent loop: run one episode of one sample against the env gateway, recording a Trajectory.

The loop keeps the token sequence exactly as the model saw and produced it: the prompt is rendered once,
each assistant turn appends the sampled token ids (never re-tokenized), and each observation appends the
rendered env messages. A tool call the model wrote badly becomes an error observation (the model learns
from it); an env failure ends the episode as `env_error`, which the caller retries or counts, never trains on.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from agentrl.envs.api import EnvError
from agentrl.rollout import chat
from agentrl.rollout.engine import Engine, SamplingConfig
from agentrl.types import Status, Trajectory, TrajectoryBuilder, new_id


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int
    """A global cap on assistant turns below the task's own limit (0: the task's limit alone). Episodes
    it ends early are `truncated`: the run's budget, not the agent's failure."""
    max_model_len: int
    max_new_tokens: int


# A task that does not say its round limit (an old server) gets this many turns before the cap.
DEFAULT_TASK_TURNS = 20


def turn_budget(task_max_turns: int | None, cap: int) -> tuple[int, bool]:
    """(turns this episode may take, whether reaching them means the cap cut it short of the task's limit)."""
    own = task_max_turns if task_max_turns and task_max_turns > 0 else DEFAULT_TASK_TURNS
    if cap and cap < own:
        return cap, True
    return own, False


async def run_episode(client: Any, engine: Engine, tokenizer: Any, task: str, index: str, group_id: str,
                      sampling: SamplingConfig, limits: EpisodeLimits) -> Trajectory:
    """Play one episode; raises EnvError only if the session could not be started."""
    t_start = time.perf_counter()
    timings = {"generate_s": 0.0, "env_s": 0.0}
    start = await client.start_sample(task, index)
    timings["env_s"] += time.perf_counter() - t_start
    sid = start.session_id
    b = TrajectoryBuilder()
    prompt = tokenizer.encode(chat.render(start.messages, start.tools, add_generation_prompt=True),
                              add_special_tokens=False)
    b.add_context(prompt[: limits.max_model_len])  # an over-long prompt ends at once as context_limit
    im_end = tokenizer.convert_tokens_to_ids(chat.IM_END)
    max_turns, capped = turn_budget(start.max_turns, limits.max_turns)
    # Reaching max_turns below: the task's own limit ends the episode as turn_limit (turns with unreadable
    # calls count, as the env's Session counts every assistant message); the run's cap, as truncated.
    status = Status.TRUNCATED if capped else Status.TURN_LIMIT
    reward, metrics, turns, invalid = 0.0, {}, 0, 0
    done = False
    try:
        while turns < max_turns:
            budget = limits.max_model_len - len(b)
            if budget < 2:
                status = Status.CONTEXT_LIMIT
                break
            t0 = time.perf_counter()
            s = SamplingConfig(min(limits.max_new_tokens, budget - 1), sampling.temperature, sampling.top_p,
                               sampling.stop_token_ids, sampling.seed)
            gen = await engine.generate(b.tokens, s, session_id=sid)
            timings["generate_s"] += time.perf_counter() - t0
            b.add_action(gen.token_ids, gen.logprobs, gen.version, gen.engine_id)
            turns += 1
            parsed = chat.parse_assistant(tokenizer.decode(gen.token_ids, skip_special_tokens=False),
                                          call_id_prefix=f"call_{turns}")
            if gen.finish_reason == "stop" and gen.token_ids and gen.token_ids[-1] != im_end:
                # ended on EOS rather than <|im_end|>: close the turn (not trained on) so the next
                # observation follows the chat format
                b.add_context([im_end])
            if gen.finish_reason == "length":
                if len(b) + 1 >= limits.max_model_len:
                    status = Status.CONTEXT_LIMIT
                    break
                # The turn ran out of tokens before <|im_end|>: close it (not trained on) and let the
                # observation tell the model, as with any malformed call.
                b.add_context([im_end])
                if not parsed.errors:
                    parsed.errors.append(chat.ToolCallError("", "the message was cut off at the token limit"))
            if parsed.errors:
                invalid += 1
                observation = [{"role": "tool", "content": chat.format_errors(parsed.errors)}]
            else:
                t0 = time.perf_counter()
                res = await client.interact(sid, parsed.to_message())
                timings["env_s"] += time.perf_counter() - t0
                if res.done:
                    done, reward, status, metrics = True, float(res.reward), Status(res.status), dict(res.metrics)
                    break
                observation = res.messages
            obs_ids = tokenizer.encode(chat.render_observation(observation), add_special_tokens=False)
            if len(b) + len(obs_ids) >= limits.max_model_len:  # no room left for the next turn
                status = Status.CONTEXT_LIMIT
                break
            b.add_context(obs_ids)
    except EnvError:  # the worker died, the session expired or the gateway failed: infrastructure
        status, metrics = Status.ENV_ERROR, {"env_error": 1.0}  # not `done`: cancel below frees the slot
    finally:
        if not done:
            try:
                await client.cancel(sid)
            except EnvError:
                pass
    metrics.setdefault("success", 0.0)
    metrics["invalid_calls"] = float(invalid)
    timings["total_s"] = time.perf_counter() - t_start
    return b.build(traj_id=new_id(), task=task, index=index, group_id=group_id, reward=reward,
                   status=status, num_turns=turns, timings=timings, metrics=metrics)
