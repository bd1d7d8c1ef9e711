"""Environments behind one function-calling API, by layer (docs/architecture.md §4):

  * the task author's API: `task` (Task, Episode, Action, StepResult, tool_message, EnvError);
    `tasks/` holds the built-in tasks and the registry (`get_task`, `register_task`);
  * the layer every task shares: `session` (`Session`, `ToolBox`: call checks, turn limit, failures),
    `protocol` (strict or AgentBench-faithful call policies), `json_args` (bounded JSON arguments);
  * the wire: `wire_types` (the gateway's JSON types), `client` (the gateway client the rollout uses),
    `inprocess` (the same client over in-process sessions, no HTTP);
  * the env worker: `worker` (its routes), `isolation` (a process per session), `listener` and `wire`
    (the HTTP pieces the worker and the controller share), `serving` (process setup of both);
  * `sandbox/`: the os task's runtime (a per-session sandbox: bubblewrap or Apptainer);
  * `checks/`: tools that check tasks, run from `jobs/` (contract, expert report, attacks, gold replays);
  * `task_data`: the generators of the built-in tasks' data files.

Importing this package imports nothing else and starts nothing: pick the submodule you need.
"""
