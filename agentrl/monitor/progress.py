"""The one progress helper: a long piece of work (the warm start's steps, the expert's demonstrations, each
task of an evaluation) as a tqdm bar on a terminal, plain periodic lines where stdout is not one (Slurm logs,
pipes), never a bar's carriage returns.

    warm start: 120/400 (30%) | loss 0.412 token_acc 0.871 | 3.10 /s, eta 1m30s

One line every `every_s` seconds and one at the end; without tqdm a terminal gets the lines too. The
evaluation's per-task progress (`agentrl.evaluation.progress`) is one `StepProgress` per task.
"""
from __future__ import annotations

import sys
import time
from typing import Any, TextIO


def duration(s: float) -> str:
    s = int(max(s, 0))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class StepProgress:
    """`total` units of work named `desc`; `update(n, **postfix)` as they finish (postfix: the latest numbers
    to show beside the count, e.g. loss=0.41).

    `initial`: units already done before this run (a resumed evaluation): the count starts there, the rate and
    the eta count this run's units only. `unit` names them in the rate (`ep` → `2.10 ep/s`); `postfix_sep` goes
    between the count and the postfix; `position`: the bar's row among several (tqdm's)."""

    def __init__(self, total: int, desc: str, stream: TextIO | None = None, bars: bool | None = None,
                 every_s: float = 30.0, clock: Any = time.monotonic, initial: int = 0, unit: str = "",
                 postfix_sep: str = " | ", position: int | None = None) -> None:
        self.total, self.desc, self.stream = total, desc, stream or sys.stdout
        self.count, self.initial, self.every_s, self.clock = initial, initial, every_s, clock
        self.unit, self.postfix_sep = unit, postfix_sep
        self.t0 = self.last = clock()
        self.postfix: dict[str, Any] = {}
        self._bar: Any = None
        if bars is None:
            bars = bool(getattr(self.stream, "isatty", lambda: False)())
        if bars:
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=total, initial=initial, desc=desc, position=position, file=self.stream,
                                 dynamic_ncols=True, leave=True)

    def update(self, n: int = 1, **postfix: Any) -> None:
        self.count += n
        self.postfix.update(postfix)
        if self._bar is not None:
            self._bar.update(n)
            if postfix:
                self._bar.set_postfix({k: _fmt(v) for k, v in self.postfix.items()}, refresh=False)
            return
        now = self.clock()
        if now - self.last >= self.every_s or self.count >= self.total:
            self.last = now
            print(self.line(now), file=self.stream, flush=True)

    def line(self, now: float | None = None) -> str:
        now = self.clock() if now is None else now
        rate = (self.count - self.initial) / max(now - self.t0, 1e-9)
        eta = duration((self.total - self.count) / rate) if rate > 0 else "?"
        extra = " ".join(f"{k} {_fmt(v)}" for k, v in self.postfix.items())
        return (f"{self.desc}: {self.count}/{self.total} ({100 * self.count / max(self.total, 1):.0f}%)"
                + (f"{self.postfix_sep}{extra}" if extra else "") + f" | {rate:.2f} {self.unit}/s, eta {eta}")

    def close(self) -> None:
        """Ends the bar; in line mode, a last line if the work stopped short of `total` (an early stop)."""
        if self._bar is not None:
            self._bar.close()
        elif self.initial < self.count < self.total:
            print(self.line(), file=self.stream, flush=True)


def _fmt(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)
