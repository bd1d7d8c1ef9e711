"""Preemption: the job's warning signal becomes "finish the step, checkpoint, then requeue".

Slurm warns a job before its time limit (`--signal=B:USR1@<s>` in our scripts; submitit's own is USR2)
and sends SIGTERM when it preempts or cancels. A handler must not checkpoint by itself (it would run in
the middle of a step); it only sets a flag that the training loop reads between steps:

    preemption = Preemption().install()          # once, in the main thread, before the loop
    for step in range(start, steps):
        train_one_step()
        if preemption.requested:
            save_checkpoint(step)                # state, consumed-trajectory ledger, policy version
            preemption.exit_for_requeue()        # requeue (unless the batch script will) and exit 0

`exit_for_requeue` asks Slurm to requeue the job when nobody else will (outside our rendered scripts,
whose batch shell requeues once the trainer has exited), then exits. On restart Slurm keeps the job id,
so the run directory is the same and the loop resumes from the checkpoint. Standard library only.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping
from types import FrameType
from typing import NoReturn

from agentrl.launch import slurm_env

REQUEUE_BY_SCRIPT = "AGENTRL_REQUEUE_BY_SCRIPT"
"""Set (to 1) by a launcher that requeues the job itself once the trainer exits after a checkpoint."""


class Preemption:
    """A flag raised by the job's warning signals (USR1 and SIGTERM by default)."""

    def __init__(self, signals: Iterable[signal.Signals] = (signal.SIGUSR1, signal.SIGTERM)) -> None:
        self.signals = tuple(signals)
        self.received: signal.Signals | None = None

    def install(self) -> Preemption:
        """Handle the signals from now on (call from the main thread)."""
        for sig in self.signals:
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signal.Signals(signum)

    @property
    def requested(self) -> bool:
        return self.received is not None

    def exit_for_requeue(self, environ: Mapping[str, str] | None = None) -> NoReturn:
        """After the checkpoint: requeue the Slurm job (unless the launcher will) and exit 0."""
        env = os.environ if environ is None else environ
        if env.get(REQUEUE_BY_SCRIPT) != "1":
            requeue(env)
        sys.stdout.flush()
        sys.exit(0)


def requeue(environ: Mapping[str, str] | None = None) -> bool:
    """`scontrol requeue` this job. False outside Slurm. Slurm restarts it under the same id
    (after `cred_expire` seconds; SLURM_RESTART_COUNT counts the restarts)."""
    job = slurm_env.job_id(environ)
    if not job:
        return False
    subprocess.run(["scontrol", "requeue", job], check=True, timeout=60)
    return True

