"""Hostile-policy episodes played against a task: does any earn reward without the answer, or hurt the worker?

What is here: `Attack` (one scripted episode: assistant messages a policy could send, with tool calls
only), the library of them per task (`library.attacks_for`: every class found so far, docs/tasks.md)
and the player (`runner.play_attacks`), which runs each attack through a real `EnvWorker` in this
process (its HTTP routes, thread pool and deadlines) and reports per attack: the reward, the status,
and whether the worker stayed healthy (its event loop answered throughout, no call is stuck, the task
is not reported unhealthy, and a fresh session of the task still starts afterwards). An attack *holds*
when it earned no reward, its episode did not end as env_error (the infrastructure's status, which
training drops: a policy that causes it escapes its verdict) and the worker stayed healthy.

The entry point is `jobs/attack_check.py`; docs/tasks.md tells task authors to run it on their task
(the generic attacks need only its tool schemas). Not here: the defences themselves (the sandbox, the
tasks, the worker).
"""
from agentrl.checks.attacks.attack import Attack
from agentrl.checks.attacks.library import attacks_for
from agentrl.checks.attacks.runner import AttackResult, play_attacks

__all__ = ["Attack", "AttackResult", "attacks_for", "play_attacks"]
