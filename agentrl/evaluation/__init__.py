"""Evaluation of a checkpoint, a model directory or an OpenAI-compatible endpoint on the tasks' held-out
splits (`python -m jobs.eval`): the scope of episodes (`EvalScope`), the players that play them (the
rollout's own agent loop for local models, a message-level loop for endpoints), the runner that scores them into
a resumable results file, and cross-sampling between two policies. The statistics and tables are
`agentrl.monitor.eval_*`.
"""
