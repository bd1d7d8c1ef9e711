"""Gold replays: AgentBench's own gold answers replayed through our tasks, every failure classified.

For each task and split a task is built on an AgentBench checkout (`source="agentbench"`, AgentBench-FC's
faithful protocol) and its samples replayed through `Session`, as the env worker would:
  * db (`db_replay`): SELECT-type samples commit their label; INSERT/UPDATE/DELETE samples run their
    gold SQL, then commit (graded by the table hash);
  * os (`os_replay`): the task's scripted expert (its example scripts), through the public Task API only.
Each failure is classified (`classes`):
  * "data defect": the sample cannot pass in AgentBench-FC's own setup either, with the evidence shown;
  * "needs the network": the sample installs or downloads;
  * "host limit": the sample needs more of the host than this worker may give its sandboxes (an init
    that opens a file descriptor above the open-file limit the worker cannot raise);
  * "our defect": everything else, a difference of ours to fix.
For os the class comes from the episode itself and from replays of the sample's own scripts: the
episode's `setup_failed` metric and last observation (a setup that printed a name-resolution or fetch
failure needs the network; one that printed `N: Bad file descriptor` with N at or above the sandbox's
`ulimit -n` is a host limit; any other failed setup is a sandbox limit of ours), the expert's example
script (`apt`, `curl`, ... needs the network), and for a check that compares the answer with the
example's output: a replay with the answer one higher when the example counts processes, the example
replayed in many fresh sessions (does it vary?), the example run twice in the shell and once as the
grader on one state (does it change what it reports, or does the grader see another system than the
agent's shell: ours), and the check scripts run on the example's own output.

`suite.run_checks` gives {task: {split: {passed, total, failures: {class: [ids]}, details: {id:
evidence}}}}; the entry point that prints it is `jobs/agentbench_check.py`. Not here: the tasks.
"""
from agentrl.checks.replay.classes import DATA, HOST, NETWORK, NETWORK_COMMANDS, OURS, Outcome
from agentrl.checks.replay.db_replay import replay_db
from agentrl.checks.replay.os_replay import replay_os
from agentrl.checks.replay.suite import build, check, run_checks

__all__ = ["DATA", "HOST", "NETWORK", "NETWORK_COMMANDS", "OURS", "Outcome", "build", "check", "replay_db",
           "replay_os", "run_checks"]
