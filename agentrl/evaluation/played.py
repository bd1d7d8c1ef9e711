"""What one evaluated episode leaves behind, whichever player played it, and the player protocol."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from agentrl.monitor.eval_results import ScoredEpisode
from agentrl.rollout.agent_loop import Conversation
from agentrl.types import Status, Trajectory


@dataclass(frozen=True)
class Played:
    """One episode's outcome. `tokens` are the tokens the policy generated; `context_tokens` the whole
    conversation's (the local path counts them exactly, an endpoint reports its last prompt plus reply);
    `conversation` its messages (None where no session started), for the evaluation's transcripts."""

    status: Status
    reward: float
    success: float
    turns: int
    tokens: int
    context_tokens: int
    wall_s: float
    metrics: dict[str, float] = field(default_factory=dict)
    conversation: Conversation | None = None

    @classmethod
    def of_trajectory(cls, t: Trajectory, conversation: Conversation | None = None) -> Played:
        return cls(status=t.status, reward=float(t.reward), success=float(t.metrics.get("success", 0.0)),
                   turns=t.num_turns, tokens=t.num_action_tokens, context_tokens=t.num_tokens,
                   wall_s=float(t.timings.get("total_s", 0.0)), metrics=dict(t.metrics), conversation=conversation)

    def scored(self, task: str, split: str, index: str, sample: int, **extra: object) -> ScoredEpisode:
        """As a results-file line. AgentBench's score is the task's reward where the task reports one that
        differs from the verdict (webshop's partial reward), else the verdict."""
        score = float(self.metrics.get("score", self.reward))
        return ScoredEpisode(task=task, split=split, index=index, sample=sample, success=self.success, score=score,
                             status=self.status.value, turns=self.turns, tokens=self.tokens,
                             wall_s=round(self.wall_s, 4),
                             extra={"context_tokens": self.context_tokens, "reward": self.reward, **extra})


class Player(Protocol):
    """Plays one episode of (task, index); env errors are retried inside and end as `env_error`."""

    async def play(self, task: str, index: str, group: str) -> Played: ...
