"""The built-in tasks' options: one frozen dataclass per task, its fields the task constructor's keyword arguments.

What `envs.task_options.<task>` may hold, checked by the config loader at load (`agentrl.config.task_options`):
a wrong type or value fails there, naming the field, never in a worker. Each task class points at its own
(`OsTask.Options = OsOptions`); they live together here, apart from the tasks, so that loading a config imports
this module and `agentrl.sandbox.config`, not a task's data, backends or dependencies.
A user's task declares its own `Options` beside its class (docs/tasks.md).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from agentrl.sandbox.config import SandboxConfig
from agentrl.tasks.api import OptionError

Protocol = Literal["strict", "faithful"]
"""strict: this project's protocol | faithful: AgentBench-FC's own (prompts and tools read from a checkout)."""
MYSQL8_SQL_MODE = ("ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,"
                   "ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION")
"""MySQL 8's default sql_mode: AgentBench-FC's mysql:8 container sets none (see `db.backends.mariadb`)."""
CHECKOUT_VAR = "AGENTRL_AGENTBENCH_DIR"


def _from_env(var: str) -> str:
    return os.environ.get(var, "").strip()


def _require_checkout(agentbench_dir: str | None, why: str) -> None:
    """An AgentBench checkout (the option, else `AGENTRL_AGENTBENCH_DIR`) that `why` reads, or an `OptionError`."""
    root = agentbench_dir or _from_env(CHECKOUT_VAR)
    if not root:
        raise OptionError("agentbench_dir", f"{why} reads an AgentBench checkout: set it, or {CHECKOUT_VAR}")
    if not (Path(root).expanduser() / "data").is_dir():
        raise OptionError("agentbench_dir", f"{root} is not an AgentBench checkout (it has no data/ folder)")


def _check_skill(skill: float) -> None:
    if not 0.0 <= skill <= 1.0:
        raise OptionError("expert_skill", f"must be in [0, 1], got {skill}")


def _reader(source: str) -> str:
    return "source=agentbench" if source == "agentbench" else "protocol=faithful"


@dataclass(frozen=True)
class SkillOptions:
    """`lookup` and `unlock`: how often the scripted expert plays the skill the task needs."""

    expert_skill: float = 1.0
    """Share of episodes the expert plays right (0.5 leaves RL something to learn beyond imitation)."""

    def __post_init__(self) -> None:
        _check_skill(self.expert_skill)

    def per_call_limits(self) -> dict[str, float]:
        return {}


@dataclass(frozen=True)
class OsOptions:
    """`os` (`agentrl.tasks.os_task.OsTask`)."""

    source: Literal["ours", "agentbench"] = "ours"
    agentbench_dir: str | None = None
    data_dir: str | None = None
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """How sessions are isolated and limited; `sandbox.command_timeout_s` bounds one bash command."""
    protocol: Protocol | None = None
    """None: faithful with source agentbench, else strict."""
    slots: int | None = None
    """Fail at start when this many sandboxes could exhaust a host-wide table."""
    example_state: Literal["start", "end"] | None = None
    """When a check's example script runs: start (before the agent) | end (after it, AgentBench's); None: end
    under the faithful protocol, else start."""
    expert_skill: float = 1.0
    """Share of samples the scripted expert plays right; the others it answers before it has looked
    (`agentrl.tasks.shared.expert_skilled`). Below 1, imitation alone stops short of what the task allows."""

    def __post_init__(self) -> None:
        _check_skill(self.expert_skill)
        if self.source == "agentbench" or self.protocol == "faithful":
            _require_checkout(self.agentbench_dir, _reader(self.source))

    def per_call_limits(self) -> dict[str, float]:
        return {"sandbox.command_timeout_s": self.sandbox.command_timeout_s}


@dataclass(frozen=True)
class DbOptions:
    """`db` (`agentrl.tasks.db.DbTask`)."""

    backend: Literal["sqlite", "mariadb"] = "sqlite"
    mariadb_address: str = ""
    mariadb_user: str = "root"
    mariadb_password: str = ""
    mariadb_shared_account: bool = False
    mariadb_sql_mode: str = MYSQL8_SQL_MODE
    statement_timeout_s: float = 10.0
    """One SQL statement's time (within what is left of the message's budget)."""
    sqlite_affinity: Literal["text", "auto"] = "text"
    source: Literal["ours", "agentbench"] = "ours"
    agentbench_dir: str | None = None
    data_dir: str | None = None
    protocol: Protocol | None = None
    database_mb: int = 256
    expert_skill: float = 1.0
    """Share of samples the scripted expert plays right; the others it answers before it has looked
    (`agentrl.tasks.shared.expert_skilled`). Below 1, imitation alone stops short of what the task allows."""

    def __post_init__(self) -> None:
        _check_skill(self.expert_skill)
        if self.statement_timeout_s <= 0:
            raise OptionError("statement_timeout_s", f"must be > 0, got {self.statement_timeout_s}")
        if self.database_mb < 1:
            raise OptionError("database_mb", f"must be >= 1, got {self.database_mb}")
        if self.source == "agentbench" or self.protocol == "faithful":
            _require_checkout(self.agentbench_dir, _reader(self.source))

    def per_call_limits(self) -> dict[str, float]:
        return {"statement_timeout_s": self.statement_timeout_s}


@dataclass(frozen=True)
class KgOptions:
    """`kg` (`agentrl.tasks.kg.KGTask`)."""

    source: Literal["ours", "agentbench"] = "ours"
    sparql_url: str | None = None
    """source agentbench: a Freebase SPARQL endpoint (else `AGENTRL_KG_SPARQL_URL`)."""
    agentbench_dir: str | None = None
    data_dir: str | None = None
    protocol: Protocol | None = None
    expert_skill: float = 1.0
    """Share of samples the scripted expert plays right; the others it answers before it has looked
    (`agentrl.tasks.shared.expert_skilled`). Below 1, imitation alone stops short of what the task allows."""

    def __post_init__(self) -> None:
        _check_skill(self.expert_skill)
        if self.source == "agentbench" and not (self.sparql_url or _from_env("AGENTRL_KG_SPARQL_URL")):
            raise OptionError("sparql_url", "source=agentbench needs a Freebase SPARQL endpoint: set it, or "
                                            "AGENTRL_KG_SPARQL_URL")
        if self.protocol == "faithful":  # without a checkout AgentBench's questions run strict by default
            _require_checkout(self.agentbench_dir, "protocol=faithful")

    def per_call_limits(self) -> dict[str, float]:
        return {}


@dataclass(frozen=True)
class WebShopOptions:
    """`webshop` (`agentrl.tasks.webshop.WebShopTask`)."""

    source: Literal["ours", "webshop", "agentbench"] = "ours"
    webshop_dir: str | None = None
    """source webshop or agentbench: WebShop's data (else `AGENTRL_WEBSHOP_DIR`)."""
    agentbench_dir: str | None = None
    data_dir: str | None = None
    protocol: Protocol | None = None
    expert_skill: float = 1.0
    """Share of samples the scripted expert plays right; the others it answers before it has looked
    (`agentrl.tasks.shared.expert_skilled`). Below 1, imitation alone stops short of what the task allows."""

    def __post_init__(self) -> None:
        _check_skill(self.expert_skill)
        if self.source in ("webshop", "agentbench") and not (self.webshop_dir or _from_env("AGENTRL_WEBSHOP_DIR")):
            raise OptionError("webshop_dir", f"source={self.source} needs WebShop's data: set it, or "
                                             "AGENTRL_WEBSHOP_DIR")
        if self.source == "agentbench" or self.protocol == "faithful":
            _require_checkout(self.agentbench_dir, _reader(self.source))

    def per_call_limits(self) -> dict[str, float]:
        return {}


@dataclass(frozen=True)
class AlfworldOptions:
    """`alfworld` (`agentrl.tasks.alfworld.AlfworldTask`)."""

    source: Literal["ours", "alfworld", "agentbench"] = "ours"
    alfworld_data: str | None = None
    """source alfworld (or agentbench, whose games are ALFWorld's): ALFWorld's data (else `ALFWORLD_DATA`)."""
    agentbench_dir: str | None = None
    data_dir: str | None = None
    protocol: Protocol | None = None
    expert_skill: float = 1.0
    """Share of samples the scripted expert plays right; the others it answers before it has looked
    (`agentrl.tasks.shared.expert_skilled`). Below 1, imitation alone stops short of what the task allows."""

    def __post_init__(self) -> None:
        _check_skill(self.expert_skill)
        if self.source != "ours" and not (self.alfworld_data or _from_env("ALFWORLD_DATA")):
            raise OptionError("alfworld_data", f"source={self.source} needs ALFWorld's data: set it, or ALFWORLD_DATA")
        if self.protocol == "faithful":  # without a checkout ALFWorld's games run strict by default
            _require_checkout(self.agentbench_dir, "protocol=faithful")

    def per_call_limits(self) -> dict[str, float]:
        return {}


@dataclass(frozen=True)
class BfclOptions:
    """`bfcl` (`agentrl.tasks.bfcl.BfclTask`)."""

    categories: tuple[Literal["multi_turn_base", "multi_turn_long_context", "multi_turn_miss_param"], ...] = (
        "multi_turn_base",)
    data_dir: str | None = None

    def per_call_limits(self) -> dict[str, float]:
        return {}
