"""Tools that check tasks, run from `jobs/` and the tests, never by a training run's roles.

  * `contract`: the rules every task meets (`check_task`: the protocol, tool schemas, indices, a
    deterministic expert that wins, malformed calls answered as observations); `jobs/check_task.py`;
  * `expert`: a task's scripted expert played in this process through `Session`;
  * `expert_report`: the experts' success per task and split; `jobs/expert_report.py`;
  * `attacks`: hostile-policy episodes and network floods against a task and the servers;
    `jobs/attack_check.py` (the rollout's hostile-text check reuses its `AttackResult`);
  * `replay`: AgentBench's gold answers replayed through our tasks, each failure classified;
    `jobs/agentbench_check.py`;
  * `hostile`: hostile texts against the rollout's agent loop (a policy's own output, an env text it
    chose), played through the same collection code a rank runs; `jobs/attack_check.py`.

Importing this package imports nothing else: pick the module you need.
"""
