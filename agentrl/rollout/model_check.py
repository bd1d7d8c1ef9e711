"""Does a model directory work with agentrl? One scripted-expert episode of each task through the model's
own format (`jobs.check_model`).

Each episode goes through the real agent loop (in-process tasks, no workers): the expert's messages are
written in the model's own call syntax (`ChatFormat.assistant_ids`), read back by the model's vLLM parser
and sent to the task, so an episode the expert wins shows the parser round trip works for that task's
calls; the finished episode is then checked against one whole re-render of its conversation. Nothing
samples from the model, so weights do not matter: any family's directory can be checked on a CPU.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.config import ModelConfig, RunConfig
from agentrl.rollout.agent_loop import EpisodeLimits, run_episode
from agentrl.rollout.chat import ChatFormat, Transcript
from agentrl.rollout.engine import ExpertEngine, SamplingConfig
from agentrl.rollout.from_config import chat_format
from agentrl.serving.inprocess import InProcessClient
from agentrl.tasks import get_task, task_name
from agentrl.tasks.api import EnvError

log = logging.getLogger("agentrl.rollout.model_check")


@dataclass
class TaskCheck:
    task: str
    index: str
    prompt_tokens: int
    episode_tokens: int
    turns: int
    success: float
    invalid_calls: int
    mismatches: list[str]
    status: str

    @property
    def ok(self) -> bool:
        return not self.mismatches and self.invalid_calls == 0 and self.success > 0


async def _one(fmt: ChatFormat, client: InProcessClient, task: str, max_model_len: int) -> TaskCheck:
    index = (await client.indices(task, "train"))[0]
    start = await client.start_sample(task, index)
    await client.cancel(start.session_id)
    prompt = Transcript(fmt, start.messages, start.tools).prompt
    limits = EpisodeLimits(0, max_model_len, 4096)
    traj = await run_episode(client, ExpertEngine(client), fmt, task, index, "check", SamplingConfig(4096, 0.0),
                             limits)
    mismatches = _details(fmt, traj)
    return TaskCheck(task, index, len(prompt), traj.num_tokens, traj.num_turns, traj.metrics.get("success", 0.0),
                     int(traj.metrics.get("invalid_calls", 0)), mismatches, traj.status.value)


def _details(fmt: ChatFormat, traj: Any) -> list[str]:
    n = int(traj.metrics.get("template_mismatch", 0))
    return [f"{n} segment(s) differ from the whole render (run with rollout.template_check=strict for where)"] \
        if n else []


def check(model_dir: str | Path, tasks: list[str], model: ModelConfig | None = None,
          task_options: dict[str, dict[str, Any]] | None = None,
          max_model_len: int = 32768) -> tuple[ChatFormat, list[TaskCheck | tuple[str, str]]]:
    """(the model's format under the `model` settings, per task a TaskCheck or (task, why it could not run))."""
    m = model or ModelConfig()
    fmt = ChatFormat.load(model_dir, m.tool_parser, m.stop_tokens, "strict", m.template_kwargs, m.chat_template)
    out: list[TaskCheck | tuple[str, str]] = []
    for spec in tasks:
        try:
            t = get_task(spec, **(task_options or {}).get(spec, {}))
        except Exception as e:  # noqa: BLE001 - a task that needs what this machine lacks is reported, not fatal
            out.append((spec, f"cannot build the task: {type(e).__name__}: {e}"))
            continue
        client = InProcessClient({task_name(spec): t})
        try:
            out.append(asyncio.run(_one(fmt, client, task_name(spec), max_model_len)))
        except Exception as e:  # noqa: BLE001 - strict mode raises TemplateMismatch with the details
            out.append((task_name(spec), f"{type(e).__name__}: {e}"))
    return fmt, out


def turn_end_problem(fmt: ChatFormat) -> str | None:
    """Why the model's turns would not stop where the template ends them (None: the turn end is a stop token).
    A sampled turn that does not stop on it runs to rollout.max_new_tokens, past the turn's end, and every greedy
    episode ends `truncated`."""
    if fmt.turn_end is None:
        return ("the chat template closes an assistant turn with text, not one special token, so no stop token can "
                "end the model's turn (each would run to rollout.max_new_tokens): use a template whose turns end on a "
                "special token (model.chat_template)")
    if fmt.turn_end not in fmt.stop_ids:
        name = fmt.tokenizer.convert_ids_to_tokens(fmt.turn_end)
        return f"the template's turn end {name!r} ({fmt.turn_end}) is not a stop token: add it to model.stop_tokens"
    return None


async def first_prompts(client: Any, fmt: ChatFormat, tasks: list[str] | tuple[str, ...], split: str = "train",
                        samples: int = 8) -> dict[str, list[int]]:
    """Per task, the first prompt's length in tokens for its first `samples` indices of `split` (each session
    started, rendered in the model's format, cancelled); a task without that split is left out, and so is a
    sample that does not start (its episode is the evaluation's to retry, then count and report: AgentBench's
    db dev-5 has a column named '', which MySQL and MariaDB refuse)."""
    out: dict[str, list[int]] = {}
    for task in tasks:
        try:
            indices = await client.indices(task, split)
        except EnvError:
            continue
        out[task] = []
        for index in indices[:samples]:
            try:
                start = await client.start_sample(task, index)
            except EnvError as e:
                log.warning("%s %s does not start, left out of the prompt lengths: %s", task, index, e)
                continue
            try:
                out[task].append(len(fmt.prompt_ids(start.messages, start.tools)))
            finally:
                await client.cancel(start.session_id)
    return out


def prompts_too_long(lengths: dict[str, list[int]], max_model_len: int, max_new_tokens: int,
                     every: bool = False) -> str | None:
    """The error, naming both numbers, when first prompts and a turn of `max_new_tokens` cannot fit
    `max_model_len`: any prompt of a task (`every` False: training, where each such episode ends as
    context_limit before the model says a word, and a warm start would have nothing to learn from) or all of a
    task's (`every` True: an evaluation that could score nothing). None when they fit."""
    pick = min if every else max
    over = {t: max(n) for t, n in lengths.items() if n and pick(n) + max_new_tokens > max_model_len}
    if not over:
        return None
    need = max(over.values()) + max_new_tokens
    tasks = ", ".join(f"{t} (prompt {n} tokens)" for t, n in over.items())
    return (f"rollout.max_model_len: {max_model_len} tokens cannot hold the first prompt and one turn "
            f"(rollout.max_new_tokens {max_new_tokens}) of {tasks}; set rollout.max_model_len >= {need} "
            "(python -m jobs.check_model prints each task's prompt in this model's chat format)")


async def check_prompts_fit(client: Any, fmt: ChatFormat, tasks: list[str] | tuple[str, ...], max_model_len: int,
                            max_new_tokens: int) -> dict[str, list[int]]:
    """`first_prompts` of the train split, raising ValueError (`prompts_too_long`) when one cannot fit."""
    lengths = await first_prompts(client, fmt, tasks)
    problem = prompts_too_long(lengths, max_model_len, max_new_tokens)
    if problem:
        raise ValueError(problem)
    return lengths


def preflight(cfg: RunConfig) -> ChatFormat:
    """A run's model settings checked before any process starts (`jobs.train`, for a `model.path`): the chat
    format loads (template, parser, stop tokens) and each task's first prompts and a turn fit
    rollout.max_model_len. Tasks are built in this process; one that cannot be (a sandbox or server this
    machine lacks) is left to the same check at the rollout's start. Raises ValueError naming the field."""
    fmt = chat_format(cfg, Path(cfg.model.path))
    tasks = {}
    for spec in cfg.envs.tasks:
        try:
            tasks[task_name(spec)] = get_task(spec, **cfg.envs.task_options.get(spec, {}))
        except Exception as e:  # noqa: BLE001 - checked again where the task runs
            log.info("preflight: %s not built here (%s); the rollout checks its prompts at its start", spec, e)
    r = cfg.rollout
    lengths = asyncio.run(first_prompts(InProcessClient(tasks), fmt, list(tasks)))
    problem = prompts_too_long(lengths, r.max_model_len, r.max_new_tokens)
    if problem:
        raise ValueError(problem)
    return fmt
