"""agentrl.launch.preempt: the flag, the exit, squeue's time format (the requeue itself: test_slurm_cluster)."""
from __future__ import annotations

import os
import signal

import pytest

from agentrl.launch import preempt


@pytest.fixture
def restore_handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def test_signal_raises_the_flag_only(restore_handlers) -> None:
    p = preempt.Preemption().install()
    assert not p.requested
    os.kill(os.getpid(), signal.SIGUSR1)
    assert p.requested and p.received == signal.SIGUSR1


def test_sigterm_counts_too(restore_handlers) -> None:
    p = preempt.Preemption().install()
    os.kill(os.getpid(), signal.SIGTERM)
    assert p.received == signal.SIGTERM


def test_exit_outside_slurm_exits_zero_without_requeue() -> None:
    with pytest.raises(SystemExit) as e:
        preempt.Preemption().exit_for_requeue({"HOME": "/root"})
    assert e.value.code == 0
    assert preempt.requeue({}) is False
