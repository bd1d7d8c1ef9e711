"""The `db` task (AgentBench-FC's dbbench): `agentrl.tasks.db:DbTask`, described in `task`.

Modules, each importing only those after it (a test checks there is no cycle):
  task      `DbTask`: splits, protocol, the databases its sessions get
  faithful  the episode in AgentBench-FC's protocol, and where its prompts live in a checkout
  episode   the episode in this project's protocol, the tool schemas
  samples   AgentBench's dbbench entries
  grading   AgentBench's answer comparison (pure functions)
  data      this project's samples (`python -m jobs.make_task_data db`)
  backends  SQLite and MariaDB databases, the table-state hash (a package: one module per backend)
"""
from agentrl.tasks.db.episode import TOOLS, DbEpisode
from agentrl.tasks.db.grading import MODIFY, answers_match, clean_answers, normalize_value
from agentrl.tasks.db.samples import DbSample, load_samples
from agentrl.tasks.db.task import DbTask

__all__ = ["MODIFY", "TOOLS", "DbEpisode", "DbSample", "DbTask", "answers_match", "clean_answers", "load_samples",
           "normalize_value"]
