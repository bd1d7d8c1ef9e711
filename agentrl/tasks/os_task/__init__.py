"""The `os` task (AgentBench-FC's os_interaction): `agentrl.tasks.os_task:OsTask`, described in `task`.

The package keeps the name of the module it replaces (`os_task`), so configs that name
`agentrl.tasks.os_task:OsTask` still work, and no name here can be read as the standard library's `os`.
Modules, each importing only those after it (a test checks there is no cycle):
  task      `OsTask`, its episodes in both protocols, the sandbox per session
  faithful  AgentBench-FC's protocol: prompts and tools read from a checkout, its reading of a message
  problems  AgentBench's os_interaction sample format and how its scripts run
  data      this project's samples (`python -m jobs.make_task_data os`)
"""
from agentrl.tasks.os_task.problems import OsProblem, load_problems, parse_problem, script_argv
from agentrl.tasks.os_task.task import (
    SCRIPT_TIMEOUT_S,
    TOOLS,
    FaithfulOsEpisode,
    OsEpisode,
    OsTask,
    SessionBudget,
    format_output,
)

__all__ = ["SCRIPT_TIMEOUT_S", "TOOLS", "FaithfulOsEpisode", "OsEpisode", "OsProblem", "OsTask", "SessionBudget",
           "format_output", "load_problems", "parse_problem", "script_argv"]
