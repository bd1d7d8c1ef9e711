"""Episodes through the env client, many at once, with bounded retries of what the infrastructure ended.

Every caller plays its episodes through `collect`: the rollout rank (one group at a time), its expert
demonstrations and evaluations, `jobs.eval`'s local players and the agent-loop benchmark.

No episode's exception ends its caller (a rollout rank): an env failure is `env_error`, retried; an
exception of our own code (`TemplateMismatch` under `rollout.template_check: strict` included) is logged
with its cause and recorded as an `internal_error` trajectory (metrics `internal_error`, and
`template_mismatch` for the check), never retried and never trained on. Only a misconfigured run
(`FATAL_CODES`: a wrong secret, an unknown task), a failed engine (`EngineFailed`) and cancellation leave
`collect`.
"""
from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentrl.rollout.agent_loop import EngineFailed, EpisodeLimits, run_episode
from agentrl.rollout.chat import ChatFormat, TemplateMismatch
from agentrl.rollout.engine import Engine, SamplingConfig
from agentrl.tasks.api import EnvError
from agentrl.types import Status, Trajectory, new_id

log = logging.getLogger("agentrl.rollout")


# Errors a retry cannot mend: the run is misconfigured, not unlucky.
FATAL_CODES = ("unauthorized", "forbidden", "unknown_task", "bad_request")


@dataclass(frozen=True)
class Retry:
    """How an episode that the infrastructure ended is tried again.

    `max_retries` more attempts after an env_error ending, each after `backoff_s` doubling up to `max_backoff_s`;
    while no worker has room (`no_capacity`, the controller unreachable) the episode waits with the same
    backoff up to `capacity_wait_s` without spending its retries: a restarting worker is given time."""

    max_retries: int = 2
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    capacity_wait_s: float = 120.0

    def delay(self, attempt: int) -> float:
        return min(self.backoff_s * 2 ** attempt, self.max_backoff_s) * random.uniform(0.5, 1.0)


async def collect(client: Any, engine: Engine, fmt: ChatFormat, requests: list[tuple[str, str, str]],
                  sampling: SamplingConfig, limits: EpisodeLimits, concurrency: int,
                  max_retries: int | Retry, on_done: Callable[[Trajectory], None] | None = None,
                  ) -> tuple[list[Trajectory], int]:
    """Run one episode per (task, index, group_id), at most `concurrency` at once.

    Returns the trajectories (env_error ones included after the retries) and the number of retries.
    `on_done` sees each trajectory as its episode ends (after its retries): a progress bar's hook.
    """
    retry = max_retries if isinstance(max_retries, Retry) else Retry(max_retries=max_retries)
    sem = asyncio.Semaphore(concurrency)
    retries = 0

    async def one(task: str, index: str, group: str) -> Trajectory:
        nonlocal retries
        attempt, waited, traj = 0, 0.0, None
        loop = asyncio.get_running_loop()
        while True:
            async with sem:
                try:
                    traj = await run_episode(client, engine, fmt, task, index, group, sampling, limits)
                except EnvError as e:  # could not even start a session
                    if e.code in FATAL_CODES:
                        raise
                    traj = None
                    if e.code == "no_capacity" and waited < retry.capacity_wait_s:
                        pause = retry.delay(min(attempt, 4))
                        log.warning("start_sample %s/%s: %s; waiting %.1fs for capacity", task, index, e, pause)
                        t0 = loop.time()
                        await asyncio.sleep(pause)
                        waited += loop.time() - t0
                        continue
                    log.warning("start_sample %s/%s failed (%s): attempt %d", task, index, e, attempt + 1)
                except EngineFailed:  # the rank's engine is gone: every episode would fail alike
                    raise
                except Exception as e:  # noqa: BLE001 - our own code failed on this episode: record it, go on
                    return _internal_error(task, index, group, e)
            if traj is not None and traj.status != Status.ENV_ERROR:
                return traj
            if attempt >= retry.max_retries:
                break
            retries += 1
            await asyncio.sleep(retry.delay(attempt))
            attempt += 1
        if traj is None:  # keep a record: an empty env_error trajectory is counted, never trained on
            traj = Trajectory(new_id(), task, index, group, [], [], [], [], [], 0.0, Status.ENV_ERROR, 0,
                              metrics={"env_error": 1.0, "success": 0.0})
        return traj

    async def counted(task: str, index: str, group: str) -> Trajectory:
        traj = await one(task, index, group)
        if on_done is not None:
            on_done(traj)
        return traj

    trajs = await asyncio.gather(*(counted(*r) for r in requests))
    return list(trajs), retries


def _internal_error(task: str, index: str, group: str, e: Exception) -> Trajectory:
    """The record of an episode our own code failed on: logged (a mismatch by its diff, anything else with
    its traceback), counted by its status, never trained on."""
    metrics = {"internal_error": 1.0, "success": 0.0}
    if isinstance(e, TemplateMismatch):
        metrics["template_mismatch"] = 1.0
        log.error("%s/%s dropped (rollout.template_check: strict): %s", task, index, e)
    else:
        log.error("%s/%s: our own code failed on the episode; dropped, not retried", task, index, exc_info=e)
    return Trajectory(new_id(), task, index, group, [], [], [], [], [], 0.0, Status.INTERNAL_ERROR, 0,
                      metrics=metrics)
