"""Env sessions in the caller's own process: the env client's methods (`start_sample`, `interact`,
`cancel`, `indices`) over `Session` objects, with no controller, worker or HTTP in between.

For measuring the agent loop by itself (`jobs.bench_agent_loop`) and for stepping through a task in a
debugger. Task code runs on the event loop's thread, so a slow task blocks every episode: training runs
always go through env workers (`agentrl.serving.worker`), which also sandbox and time out task code.
"""
from __future__ import annotations

import uuid
from typing import Any

from agentrl.serving.session import Session
from agentrl.serving.wire_types import InteractResult, StartResult
from agentrl.tasks.api import EnvError, Task
from agentrl.tasks.json_args import clean_message


class InProcessClient:
    def __init__(self, tasks: dict[str, Task]) -> None:
        self.tasks = tasks
        self.sessions: dict[str, Session] = {}

    def _task(self, name: str) -> Task:
        if name not in self.tasks:
            raise EnvError("unknown_task", f"no task {name!r} here (have {sorted(self.tasks)})")
        return self.tasks[name]

    async def start_sample(self, task: str, index: str) -> StartResult:
        t = self._task(task)
        session = Session(t, index)
        sid = uuid.uuid4().hex
        self.sessions[sid] = session
        return StartResult(sid, list(session.messages), session.toolbox.tools, t.max_turns)

    async def expert(self, session_id: str) -> dict[str, Any]:
        """The task's scripted expert's next message (what the controller's expert route answers)."""
        session = self.sessions.get(session_id)
        if session is None:
            raise EnvError("unknown_session", f"no session {session_id!r}")
        return session.expert_message()

    async def interact(self, session_id: str, message: dict[str, Any]) -> InteractResult:
        session = self.sessions.get(session_id)
        if session is None:
            raise EnvError("unknown_session", f"no session {session_id!r}")
        result = session.interact(clean_message(message))  # as the worker does
        if result.done:
            self.sessions.pop(session_id).close()
        return result

    async def cancel(self, session_id: str) -> None:
        session = self.sessions.pop(session_id, None)
        if session is not None:
            session.close()

    async def indices(self, task: str, split: str) -> list[str]:
        return list(self._task(task).indices(split))
