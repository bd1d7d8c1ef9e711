"""The names `agentrl.envs.api` has always offered, kept so that old imports keep working. New code
imports from where they now live:

  * `agentrl.envs.task`: the task author's API (`Task`, `Episode`, `Action`, `ToolCall`, `StepResult`,
    `tool_message`, `EnvError`, the optional episode protocols, the agent's budget);
  * `agentrl.envs.session`: the layer every task shares (`Session`, `ToolBox`, the limits);
  * `agentrl.envs.wire_types`: the gateway's JSON types (`StartResult`, `InteractResult`, `require`).
"""
from agentrl.envs.session import (
    AGENT_FAULTS,
    MAX_ARGUMENT_BYTES,
    MAX_OUTPUT_CHARS,
    MAX_TOOL_CALLS,
    MESSAGE_BUDGET_S,
    Session,
    ToolBox,
    agent_fault,
    over_budget,
    truncate_messages,
)
from agentrl.envs.task import (
    ERROR_HTTP_STATUS,
    Action,
    AnswersInText,
    BudgetExceeded,
    Closable,
    EnvError,
    Episode,
    HasOwnTools,
    Status,
    StepResult,
    Task,
    ToolCall,
    message_budget,
    message_deadline,
    time_left,
    tool_message,
)
from agentrl.envs.wire_types import SHOWN_CHARS, InteractResult, StartResult, cut, require, shown

__all__ = ["AGENT_FAULTS", "ERROR_HTTP_STATUS", "MAX_ARGUMENT_BYTES", "MAX_OUTPUT_CHARS", "MAX_TOOL_CALLS",
           "MESSAGE_BUDGET_S", "SHOWN_CHARS", "Action", "AnswersInText", "BudgetExceeded", "Closable", "EnvError",
           "Episode", "HasOwnTools", "InteractResult", "Session", "StartResult", "Status", "StepResult", "Task",
           "ToolBox", "ToolCall", "agent_fault", "cut", "message_budget", "message_deadline", "over_budget",
           "require", "shown", "time_left", "tool_message", "truncate_messages"]
