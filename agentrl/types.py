"""Plain data shared by every role: the trajectory schema (docs/architecture.md §3) and its status enum.

This module holds data only. It imports numpy and nothing else of the project, so every role
(and a login node) can import it.
"""
from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SCHEMA_VERSION = 1

# Engine ids, the `engine` array of a trajectory (int16). Context tokens carry -1, the scripted expert -2.
# Current engine j (newest weights) of rollout rank r is r * engines_per_rank + j, 0..LAGGING_ENGINE_BASE-1
# (one current engine per rank: the rank); lagging engine k of rank r (cross-policy sampling, docs/architecture.md §5)
# is LAGGING_ENGINE_BASE + r * lagging_engines_per_rank + k.
# So whether a token came from the lagging pool is read off its engine id alone (`is_lagging_engine`).
LAGGING_ENGINE_BASE = 1000
MAX_ENGINE_ID = 32767  # int16


def current_engine_id(rank: int, j: int, per_rank: int) -> int:
    """The id of current engine `j` (0..per_rank-1) of rollout rank `rank`."""
    if not 0 <= j < per_rank:
        raise ValueError(f"current engine {j} of {per_rank}")
    engine = rank * per_rank + j
    if engine >= LAGGING_ENGINE_BASE:
        raise ValueError(f"current engine id {engine} reaches the lagging ids ({LAGGING_ENGINE_BASE})")
    return engine


def lagging_engine_id(rank: int, k: int, per_rank: int) -> int:
    """The id of lagging engine `k` (0..per_rank-1) of rollout rank `rank`."""
    if not 0 <= k < per_rank:
        raise ValueError(f"lagging engine {k} of {per_rank}")
    engine = LAGGING_ENGINE_BASE + rank * per_rank + k
    if engine > MAX_ENGINE_ID:
        raise ValueError(f"lagging engine id {engine} does not fit the int16 engine array")
    return engine


def is_lagging_engine(engine: np.ndarray | int) -> np.ndarray | bool:
    """True for ids of the lagging pool (elementwise for an array)."""
    return engine >= LAGGING_ENGINE_BASE


class Status(str, enum.Enum):
    """How an episode ended. completed..grader_failed are the agent's doing; truncated is the run's budget
    (`rollout.max_turns`, a global cap below the task's own limit: trained on with the task's reward and no
    failure penalty, and counted); env_error, cancelled and internal_error are infrastructure."""

    COMPLETED = "completed"
    INVALID_ACTION = "invalid_action"
    TURN_LIMIT = "turn_limit"
    CONTEXT_LIMIT = "context_limit"
    GRADER_FAILED = "grader_failed"
    """The task's grader hung or failed because of the state the agent left (a FIFO where it reads a
    file): reward 0, the agent's failure, counted per task; never env_error, which is not trained on."""
    TRUNCATED = "truncated"
    ENV_ERROR = "env_error"
    CANCELLED = "cancelled"
    INTERNAL_ERROR = "internal_error"
    """Our own rollout code failed on the episode (a bug, or the template check under `strict`): logged
    with its cause, counted, never retried and never trained on."""
    RUNNING = "running"  # only on the wire, for an episode that has not ended

    @property
    def is_infra(self) -> bool:
        """Infrastructure outcomes (ours included) are never trained on as agent failures."""
        return self in (Status.ENV_ERROR, Status.CANCELLED, Status.INTERNAL_ERROR)

    @property
    def is_agent_failure(self) -> bool:
        return self in (Status.INVALID_ACTION, Status.TURN_LIMIT, Status.CONTEXT_LIMIT, Status.GRADER_FAILED)


def new_id() -> str:
    return uuid.uuid4().hex


@dataclass
class Trajectory:
    """One episode of one sample of one task, as token arrays of equal length T.

    `loss_mask` is 1 on tokens the policy generated and 0 on prompt and observation tokens;
    `logprobs`, `policy_version` and `engine` are meaningful only where the mask is 1
    (0.0, -1 and -1 elsewhere).
    """

    traj_id: str
    task: str
    index: str
    group_id: str
    tokens: np.ndarray  # int32[T]
    loss_mask: np.ndarray  # uint8[T]
    logprobs: np.ndarray  # float32[T]
    policy_version: np.ndarray  # int32[T]
    engine: np.ndarray  # int16[T]
    reward: float
    status: Status
    num_turns: int
    timings: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tokens = np.asarray(self.tokens, dtype=np.int32)
        self.loss_mask = np.asarray(self.loss_mask, dtype=np.uint8)
        self.logprobs = np.asarray(self.logprobs, dtype=np.float32)
        self.policy_version = np.asarray(self.policy_version, dtype=np.int32)
        self.engine = np.asarray(self.engine, dtype=np.int16)
        self.status = Status(self.status)
        n = len(self.tokens)
        for name in ("loss_mask", "logprobs", "policy_version", "engine"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"Trajectory.{name} has length {len(getattr(self, name))}, tokens has {n}")

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def num_action_tokens(self) -> int:
        return int(self.loss_mask.sum())

    def oldest_version(self, lagging: bool | None = None) -> int:
        """The oldest policy version that sampled an action token (-1 if there is none).

        `lagging`: None counts every action token; False only the current pool's, True only the lagging
        pool's (by engine id, see `LAGGING_ENGINE_BASE`)."""
        keep = self.loss_mask.astype(bool)
        if lagging is not None:
            keep &= is_lagging_engine(self.engine) == lagging
        v = self.policy_version[keep]
        return int(v.min()) if len(v) else -1

    def newest_version(self) -> int:
        """The newest policy version that sampled an action token (-1 if there is none)."""
        v = self.policy_version[self.loss_mask.astype(bool)]
        return int(v.max()) if len(v) else -1

    def to_dict(self) -> dict[str, Any]:
        return {
            "traj_id": self.traj_id, "task": self.task, "index": self.index, "group_id": self.group_id,
            "tokens": self.tokens.tolist(), "loss_mask": self.loss_mask.tolist(),
            "logprobs": self.logprobs.tolist(), "policy_version": self.policy_version.tolist(),
            "engine": self.engine.tolist(), "reward": float(self.reward), "status": self.status.value,
            "num_turns": int(self.num_turns), "timings": dict(self.timings), "metrics": dict(self.metrics),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        return cls(**d)


class TrajectoryBuilder:
    """Accumulates the token arrays of a trajectory segment by segment while an episode runs."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.loss_mask: list[int] = []
        self.logprobs: list[float] = []
        self.policy_version: list[int] = []
        self.engine: list[int] = []

    def __len__(self) -> int:
        return len(self.tokens)

    def add_context(self, tokens: list[int]) -> None:
        """Prompt or observation tokens: not trained on."""
        n = len(tokens)
        self.tokens += tokens
        self.loss_mask += [0] * n
        self.logprobs += [0.0] * n
        self.policy_version += [-1] * n
        self.engine += [-1] * n

    def add_action(self, tokens: list[int], logprobs: list[float], version: int, engine: int) -> None:
        """Tokens the policy sampled, with the behaviour log-prob of each."""
        if len(tokens) != len(logprobs):
            raise ValueError("one log-prob per sampled token")
        n = len(tokens)
        self.tokens += tokens
        self.loss_mask += [1] * n
        self.logprobs += list(logprobs)
        self.policy_version += [version] * n
        self.engine += [engine] * n

    def build(self, **fields: Any) -> Trajectory:
        return Trajectory(
            tokens=np.array(self.tokens, np.int32), loss_mask=np.array(self.loss_mask, np.uint8),
            logprobs=np.array(self.logprobs, np.float32), policy_version=np.array(self.policy_version, np.int32),
            engine=np.array(self.engine, np.int16), **fields,
        )
