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


def parse_splits(text: str, default: tuple[int, int]) -> list[tuple[int, int]]:
    """"1:1,1:2" -> [(1, 1), (1, 2)]: (trainer threads, engine threads) of each async split; "" -> [default]."""
    if not text:
        return [default]
    try:
        splits = [(int(a), int(b)) for a, b in (x.split(":") for x in text.split(","))]
    except ValueError:
        raise ValueError(f"--threads {text!r}: TRAINER:ENGINE thread counts, comma-separated (e.g. 1:1,1:2)") from None
    if any(t < 1 or e < 1 for t, e in splits) or len(set(splits)) != len(splits):
        raise ValueError(f"--threads {text!r}: distinct splits, each count >= 1")
    return splits


def async_variants(staleness: str, ranks: str, splits: list[tuple[int, int]] | None = None
                   ) -> dict[str, tuple[int, int, int, int]]:
    """The async sides: (max_staleness, rollout ranks, trainer threads, engine threads) for every combination
    of the lists; the first is "async" (its run dir is runs/bench/async, what `jobs.plan_pipeline
    --check-bench` reads), the others "async-s<S>-r<R>", with "-t<T>x<E>" added when several splits are
    measured."""
    splits = splits or [(1, 1)]
    combos = [(int(s), int(r), t, e) for s in staleness.split(",") for r in ranks.split(",") for t, e in splits]
    if any(s < 0 or r < 1 for s, r, _, _ in combos) or len(set(combos)) != len(combos):
        raise ValueError(f"--staleness {staleness!r} / --ranks {ranks!r}: need distinct values, staleness >= 0, "
                         "ranks >= 1")
    tagged = len(splits) > 1
    return {("async" if i == 0 else f"async-s{s}-r{r}" + (f"-t{t}x{e}" if tagged else "")): (s, r, t, e)
            for i, (s, r, t, e) in enumerate(combos)}


def best_splits(variants: dict[str, tuple[int, int, int, int]], traj_per_s: dict[str, float]
                ) -> dict[str, dict[str, object]]:
    """For each (max_staleness, ranks) measured with several thread splits: the split whose median steady
    throughput was highest (the measured decision), keyed "s<S>-r<R>", with every split's throughput."""
    out: dict[str, dict[str, object]] = {}
    for name, (s, r, t, e) in variants.items():
        entry = out.setdefault(f"s{s}-r{r}", {"traj_per_s": {}})
        entry["traj_per_s"][f"{t}:{e}"] = traj_per_s[name]  # type: ignore[index]
    for entry in out.values():
        rates: dict[str, float] = entry["traj_per_s"]  # type: ignore[assignment]
        entry["best"] = max(rates, key=rates.__getitem__)
    return {k: v for k, v in out.items() if len(v["traj_per_s"]) > 1}  # type: ignore[arg-type]
