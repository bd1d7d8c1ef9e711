"""Progress of a long evaluation: a bar per task on a terminal (tqdm), plain periodic lines elsewhere.

Slurm logs and pipes get one line per task every `every_s` seconds and when a task finishes
(`eval lookup: 120/800 (15%) success 0.617 env_err 0 | 2.1 ep/s, eta 5m24s`), never a bar's carriage
returns. Without tqdm a terminal gets the plain lines too.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

from agentrl.monitor.eval_results import ScoredEpisode


def _duration(s: float) -> str:
    s = int(max(s, 0))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class Progress:
    """Counts scored episodes per task; `totals` are the episodes planned, `done` those already in the
    results file when the run started (a resumed evaluation starts its bars there)."""

    def __init__(self, totals: Mapping[str, int], done: Mapping[str, int], stream: TextIO | None = None,
                 bars: bool | None = None, every_s: float = 30.0) -> None:
        self.stream = stream or sys.stdout
        self.totals, self.count = dict(totals), {t: int(done.get(t, 0)) for t in totals}
        self.ok = {t: 0 for t in totals}
        self.env_err = {t: 0 for t in totals}
        self.new = {t: 0 for t in totals}
        self.every_s, self.t0 = every_s, time.monotonic()
        self.last_line = {t: self.t0 for t in totals}
        self._bars: dict[str, Any] = {}
        if bars is None:
            bars = bool(getattr(self.stream, "isatty", lambda: False)())
        if bars:
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bars = {t: tqdm(total=n, initial=self.count[t], desc=f"eval {t}", position=i, file=self.stream,
                                      dynamic_ncols=True, leave=True) for i, (t, n) in enumerate(self.totals.items())}

    def update(self, ep: ScoredEpisode) -> None:
        t = ep.task
        self.count[t] += 1
        self.new[t] += 1
        self.ok[t] += ep.success > 0.5
        self.env_err[t] += ep.status == "env_error"
        if t in self._bars:
            self._bars[t].update(1)
            self._bars[t].set_postfix(success=f"{self.ok[t] / self.new[t]:.3f}", env_err=self.env_err[t],
                                      refresh=False)
            return
        now = time.monotonic()
        if now - self.last_line[t] >= self.every_s or self.count[t] >= self.totals[t]:
            self.last_line[t] = now
            print(self.line(t, now), file=self.stream, flush=True)

    def line(self, task: str, now: float | None = None) -> str:
        """One plain progress line of `task`; success and the rate are over this run's new episodes."""
        now = time.monotonic() if now is None else now
        n, total, new = self.count[task], self.totals[task], self.new[task]
        rate = new / max(now - self.t0, 1e-9)
        eta = (total - n) / rate if rate > 0 else float("inf")
        succ = f"{self.ok[task] / new:.3f}" if new else "-"
        return (f"eval {task}: {n}/{total} ({100 * n / max(total, 1):.0f}%) success {succ} "
                f"env_err {self.env_err[task]} | {rate:.2f} ep/s, eta {_duration(eta) if rate > 0 else '?'}")

    def close(self) -> None:
        for bar in self._bars.values():
            bar.close()
