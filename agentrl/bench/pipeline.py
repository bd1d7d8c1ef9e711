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


def ratio_tag(name: str) -> str:
    """The ratio suffix of an async side: "" for the first ("async"), "_s4_r2" for "async-s4-r2"."""
    return "" if name == "async" else name[len("async"):].replace("-", "_")


def async_variants(staleness: str, ranks: str) -> dict[str, tuple[int, int]]:
    """The async sides: every (max_staleness, rollout ranks) pair of the two lists; the first is "async"
    (its run dir is runs/bench/async, what `jobs.plan_pipeline --check-bench` reads), the others
    "async-s<S>-r<R>"."""
    pairs = [(int(s), int(r)) for s in staleness.split(",") for r in ranks.split(",")]
    if any(s < 0 or r < 1 for s, r in pairs) or len(set(pairs)) != len(pairs):
        raise ValueError(f"--staleness {staleness!r} / --ranks {ranks!r}: need distinct values, staleness >= 0, "
                         "ranks >= 1")
    return {("async" if i == 0 else f"async-s{s}-r{r}"): (s, r) for i, (s, r) in enumerate(pairs)}
