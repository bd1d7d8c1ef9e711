"""StepProgress: plain lines where stdout is not a terminal (a line every `every_s` and one at the end)."""
from __future__ import annotations

import io

from agentrl.monitor.progress import StepProgress, duration


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_lines_every_period_and_at_the_end() -> None:
    out, clock = io.StringIO(), Clock()
    p = StepProgress(10, "warm start", stream=out, every_s=30.0, clock=clock)
    for i in range(10):
        clock.t += 5.0  # 2 steps per 10 s: lines at 30 s, 60 s, and the last step
        p.update(1, loss=1.0 / (i + 1), token_acc=0.5)
    p.close()
    lines = out.getvalue().splitlines()
    assert lines == ["warm start: 6/10 (60%) | loss 0.167 token_acc 0.500 | 0.20 /s, eta 20s",
                     "warm start: 10/10 (100%) | loss 0.100 token_acc 0.500 | 0.20 /s, eta 0s"]


def test_an_early_stop_says_where_it_stopped() -> None:
    out, clock = io.StringIO(), Clock()
    p = StepProgress(400, "warm start", stream=out, every_s=1e9, clock=clock)
    clock.t += 20.0
    p.update(40)
    p.close()
    assert out.getvalue() == "warm start: 40/400 (10%) | 2.00 /s, eta 3m00s\n"
    assert duration(3725) == "1h02m" and duration(59) == "59s"


def test_a_terminal_gets_a_bar() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    p = StepProgress(3, "expert demonstrations", stream=out)
    for _ in range(3):
        p.update(1, last="lookup")
    p.close()
    assert "expert demonstrations" in out.getvalue() and "3/3" in out.getvalue() and "\r" in out.getvalue()
