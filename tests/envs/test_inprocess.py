"""The in-process env client answers as the controller does: the same StartResult/InteractResult, sessions
freed when they end or are cancelled, unknown tasks and sessions as EnvError."""
from __future__ import annotations

import asyncio

import pytest

from agentrl.serving.inprocess import InProcessClient
from agentrl.serving.session import Session
from agentrl.tasks import get_task
from agentrl.tasks.api import EnvError
from agentrl.types import Status


def test_an_expert_episode_and_a_bad_call() -> None:
    task = get_task("lookup")
    client = InProcessClient({"lookup": task})

    async def play() -> None:
        idx = (await client.indices("lookup", "train"))[0]
        start = await client.start_sample("lookup", idx)
        assert start.max_turns == task.max_turns and start.tools and start.messages
        bad = await client.interact(start.session_id, {"role": "assistant", "content": "no call here"})
        assert not bad.done and bad.messages  # an observation the model can learn from
        # the scripted expert's moves, from a twin session, win the episode
        twin = Session(task, idx)
        result = None
        while not twin.done:
            msg = twin.expert_message()
            twin.interact(msg)
            result = await client.interact(start.session_id, msg)
        assert result is not None and result.done and result.status == Status.COMPLETED and result.reward > 0
        assert client.sessions == {}  # freed at the end
        other = await client.start_sample("lookup", idx)
        await client.cancel(other.session_id)
        await client.cancel(other.session_id)  # twice is fine
        assert client.sessions == {}
        with pytest.raises(EnvError) as e:
            await client.start_sample("nope", "0")
        assert e.value.code == "unknown_task"
        with pytest.raises(EnvError):
            await client.interact(other.session_id, {"role": "assistant", "content": "x"})

    asyncio.run(play())
