"""The serving layer: tasks behind HTTP, one session per episode (docs/architecture.md §4, docs/controller.md).

  * the session every task runs in: `session` (`Session`, `ToolBox`: call checks, the turn limit, the
    agent's budget per message, failures);
  * the env worker: `worker` (its routes), `isolation` (a process per session);
  * the wire: `wire_types` (the session routes' JSON types), `wire` and `listener` (the HTTP pieces the worker
    and the controller share), `process` (the process setup of both);
  * the clients: `client` (the env client the rollout uses), `inprocess` (the same client over
    sessions in this process, no HTTP);
  * `controller/`: the env controller (registry and routing, its HTTP server, its statistics).

The tasks themselves are `agentrl.tasks`; this layer builds them from `envs.tasks` and never teaches how to
write one. Importing this package imports nothing else and starts nothing: pick the submodule you need.
"""
