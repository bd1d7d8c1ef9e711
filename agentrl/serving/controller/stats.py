"""The controller's statistics over time, in TensorBoard under the `env/*` names of docs/architecture.md §9.

The controller is the one process that sees every session of the run, so it logs them itself (role
"controller", its own event file under RUN_DIR/tb), the same way whether it runs beside the trainer on a
workstation or in its own Slurm group: nothing polls it from outside, and nothing is logged twice. Its
x-axis is whole seconds since the controller started (the controller knows no training step; TensorBoard's
"relative" and "wall" axes line it up with the other roles' curves).

    env/active_sessions        sessions open now
    env/sessions/<task>        of them, per task
    env/latency_p50, _p99      controller call wall time over the last calls (ms; `LatencyStats`' window)
    env/errors                 failures so far, each counted once (cumulative)
    env/errors/<class>         of them, by class (`Controller.errors_by_class`: causes of sessions ended as
                               env_error, failed starts, internal errors)
    env/workers_live           live workers (not declared dead; draining ones included)
    env/ended_sessions         sessions the controller remembers as ended (its tombstones)

`scalars_of` maps a /status answer to those names (pure, tested against a real controller); `log_periodically`
is the task that writes them every `period_s`.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger("agentrl.serving.controller")


def scalars_of(status: Mapping[str, Any], tasks: tuple[str, ...] = ()) -> dict[str, float]:
    """The `env/*` scalars of one /status answer. `tasks`: per-task session counts to log even at 0 (a task
    without open sessions is absent from /status, and a curve that stops is not one that fell to 0)."""
    out = {"env/active_sessions": float(status["active_sessions"]),
           "env/latency_p50": float(status["latency_ms"]["p50"]), "env/latency_p99": float(status["latency_ms"]["p99"]),
           "env/errors": float(status["errors"]),
           "env/workers_live": float(sum(1 for w in status["workers"] if w["alive"])),
           "env/ended_sessions": float(status.get("ended_sessions", 0))}
    for task in sorted({*tasks, *status["sessions"]}):
        out[f"env/sessions/{task}"] = float(status["sessions"].get(task, 0))
    for cls, n in sorted(status["errors_by_class"].items()):
        out[f"env/errors/{cls}"] = float(n)
    return out


async def log_periodically(status: Callable[[], Mapping[str, Any]], monitor: Any, period_s: float,
                           tasks: tuple[str, ...] = (), clock: Callable[[], float] = time.monotonic) -> None:
    """Write `scalars_of(status())` to `monitor` now and every `period_s` seconds until cancelled, then once
    more (the last state of a run that is stopping)."""
    t0 = clock()

    def write() -> None:
        try:
            monitor.scalars(scalars_of(status(), tasks), int(clock() - t0))
        except Exception:  # noqa: BLE001 - statistics must never take the controller down
            log.exception("writing the controller's statistics failed")

    try:
        while True:
            write()
            await asyncio.sleep(period_s)
    except asyncio.CancelledError:
        write()
        raise
