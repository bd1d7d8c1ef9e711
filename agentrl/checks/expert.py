"""Play a task's scripted expert in this process, through `Session` (the layer the env worker runs):
what the expert report, the AgentBench check and task tests use to measure a task by its own expert."""
from __future__ import annotations

import logging

from agentrl.serving.session import Session
from agentrl.tasks.api import EnvError, Task
from agentrl.types import Status

log = logging.getLogger("agentrl.checks.expert")


def play(task: Task, index: str, max_turns: int | None = None) -> tuple[float, Status, int]:
    """One expert episode: (reward, status, turns). Start failures come back as env_error."""
    try:
        session = Session(task, index)
    except EnvError as e:
        log.warning("%s %s did not start: %s", task.name, index, e.message)
        return 0.0, Status.ENV_ERROR, 0
    try:
        for _ in range(max_turns or task.max_turns):
            result = session.interact(session.expert_message())
            if result.done:
                return result.reward, result.status, session.turns
        return 0.0, Status.TURN_LIMIT, session.turns
    except EnvError as e:
        log.warning("%s %s failed: %s", task.name, index, e.message)
        return 0.0, Status.ENV_ERROR, session.turns
    finally:
        session.close()
