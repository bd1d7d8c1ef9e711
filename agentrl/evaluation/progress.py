"""Progress of a long evaluation: one `agentrl.monitor.progress.StepProgress` per task (a bar per task on a
terminal, plain periodic lines elsewhere), counting successes and env errors beside the episodes.

Slurm logs and pipes get one line per task every `every_s` seconds and when a task finishes
(`eval lookup: 120/800 (15%) success 0.617 env_err 0 | 2.10 ep/s, eta 5m24s`), never a bar's carriage
returns. Without tqdm a terminal gets the plain lines too.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TextIO

from agentrl.monitor.eval_results import ScoredEpisode
from agentrl.monitor.progress import StepProgress


class Progress:
    """Counts scored episodes per task; `totals` are the episodes planned, `done` those already in the
    results file when the run started (a resumed evaluation starts its bars there)."""

    def __init__(self, totals: Mapping[str, int], done: Mapping[str, int], stream: TextIO | None = None,
                 bars: bool | None = None, every_s: float = 30.0) -> None:
        self.ok = {t: 0 for t in totals}
        self.env_err = {t: 0 for t in totals}
        self.new = {t: 0 for t in totals}
        self.tasks = {t: StepProgress(n, f"eval {t}", stream, bars, every_s, initial=int(done.get(t, 0)), unit="ep",
                                      postfix_sep=" ", position=i) for i, (t, n) in enumerate(totals.items())}

    def update(self, ep: ScoredEpisode) -> None:
        """One more scored episode; success is over this run's new episodes."""
        t = ep.task
        self.new[t] += 1
        self.ok[t] += ep.success > 0.5
        self.env_err[t] += ep.status == "env_error"
        self.tasks[t].update(1, success=self.ok[t] / self.new[t], env_err=self.env_err[t])

    def line(self, task: str, now: float | None = None) -> str:
        """One plain progress line of `task`."""
        return self.tasks[task].line(now)

    def close(self) -> None:
        for p in self.tasks.values():
            p.close()
