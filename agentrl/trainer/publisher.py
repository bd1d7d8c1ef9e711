"""Weights v<N> from the trainer's hub to the engines, overlapped with the next step."""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import torch

from agentrl.transport import weights as weights_io
from agentrl.transport.channel import TrainerChannel


class Publisher:
    """Weights v<N> to the engines: the versioned directory always (restarts read it), plus the in-job
    broadcast when configured. The weights come either staged (`weights_io.Staged`: the trainer ranks
    streamed them into a temporary directory tensor by tensor, `Learner.end_step`) or as a whole state dict
    (copied to CPU on the trainer's thread). Putting the directory in place (fsync, rename, pruning), writing a
    state dict, and the broadcast run on a background thread, so the next step overlaps them (it waits only if
    the previous publish is still running).

    Under the broadcast, staged weights are read back from the written file for sending, whole (in the model's
    dtype): the broadcast sends one message of every tensor."""

    def __init__(self, run_dir: Path, broadcast: Any = None, base: Path | None = None,
                 chat_template: str | None = None) -> None:
        self.run_dir, self.broadcast, self.base, self.chat_template = run_dir, broadcast, base, chat_template
        self.dtype = weights_io.model_dtype(base) if base is not None else None  # the model's own, as published
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.wait_s = 0.0
        self.unannounced: int | None = None  # a version published but not yet announced to the rollout ranks

    def publish(self, version: int, state: dict[str, torch.Tensor] | weights_io.Staged) -> None:
        self.join()
        staged = state if isinstance(state, weights_io.Staged) else None
        copy = {} if staged is not None else {
            k: v.detach().to("cpu", dtype=self.dtype if self.dtype is not None and v.is_floating_point()
                             else v.dtype, copy=True) for k, v in state.items()}

        def work() -> None:
            try:
                if staged is not None:
                    path = weights_io.publish_staged(staged)
                    if self.broadcast is not None:
                        self.broadcast.send(version, weights_io.iter_weights(path))
                    return
                weights_io.publish(self.run_dir, version, copy, base=self.base, chat_template=self.chat_template)
                if self.broadcast is not None:
                    self.broadcast.send(version, copy.items())
            except BaseException as e:  # noqa: BLE001 - re-raised on the trainer thread by join()
                self._error = e

        self._thread = threading.Thread(target=work, name=f"publish-v{version}", daemon=True)
        self._thread.start()
        self.unannounced = version

    def announce(self, ch: TrainerChannel, wait: bool = False) -> None:
        """Notify the rollout ranks of the newest version once it is complete (directory written, broadcast
        sent): a notice never names weights that are not there yet. From the trainer thread only (MPI)."""
        if self.unannounced is None:
            return
        if wait:
            self.join()
        if self._thread is None or not self._thread.is_alive():
            self.join()
            ch.notify(self.unannounced)
            self.unannounced = None

    def close(self) -> None:
        """End the broadcast with an empty message of version -1: receivers leave their loop, so no process
        exits with a collective pending (gloo aborts the process then)."""
        self.join()
        if self.broadcast is not None:
            self.broadcast.send(-1, [])

    def join(self) -> None:
        if self._thread is not None:
            t0 = time.perf_counter()
            self._thread.join()
            self.wait_s += time.perf_counter() - t0
            self._thread = None
        if self._error is not None:
            raise RuntimeError("publishing weights failed") from self._error
