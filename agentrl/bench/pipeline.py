"""Throughput of a training run from the times its steps finished (`jobs.bench_pipeline` compares the
synchronous and the asynchronous schedule with it)."""
from __future__ import annotations


def throughput(step_t: dict[int, float], t_v0: float | None, per_step: int) -> tuple[float, float]:
    """(steady-state trajectories/s, end-to-end trajectories/s).

    Args:
        step_t: step number (1..N) -> wall time it finished, seconds.
        t_v0: wall time the first weights (v0) appeared; None: measured from step 1.
        per_step: trajectories trained per step.

    Steady state counts steps 2..N over the time from the end of step 1 to the end of step N, so that start-up
    and the pipeline's fill do not dilute it; end to end counts all N steps from weights v0 on.
    """
    n = max(step_t)
    steady = (n - 1) * per_step / max(step_t[n] - step_t[1], 1e-9)
    e2e = n * per_step / max(step_t[n] - (t_v0 or step_t[1]), 1e-9)
    return steady, e2e
