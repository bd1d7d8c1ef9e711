"""Where a rollout rank finds new weights: the versioned directories, or the in-job broadcast.

Both answer `newest(notice_version)` without blocking (the rollout's event loop asks every tick) and
`wait(version, timeout_s)` (blocking: the first weights, and the final ones before the last evaluation).
A loader is a zero-argument callable yielding (name, tensor) pairs, what `engine.load_weights` takes.
The directory stays the fallback: the first weights of a run (and of a restarted rank) come from it.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import torch

from agentrl.transport import weights as weights_io

Loader = Callable[[], Iterator[tuple[str, torch.Tensor]]]

STORE_KEY = "weights_store"  # rendezvous.json: {"host", "port"} of the broadcast group's TCPStore


class WeightSource(Protocol):
    def newest(self, notice_version: int) -> tuple[int, Loader] | None: ...

    def wait(self, version: int, timeout_s: float) -> tuple[int, Loader]: ...

    def close(self) -> None: ...


class DirWeights:
    """weights/v<N> directories. A notice names a version whose directory is complete (the trainer announces
    only after writing it); if a newer one is already there, that one is taken."""

    def __init__(self, run_dir: Path, poll_s: float = 0.05) -> None:
        self.run_dir, self.poll_s = run_dir, poll_s
        self._seen = -1

    def _loader(self, version: int) -> Loader:
        def load() -> Iterator[tuple[str, torch.Tensor]]:
            try:
                return weights_io.iter_weights(weights_io.version_dir(self.run_dir, version))
            except FileNotFoundError:  # pruned by a newer version meanwhile (keep_last): take the newest
                latest = weights_io.latest_version(self.run_dir)
                return weights_io.iter_weights(weights_io.version_dir(self.run_dir, latest))
        return load

    def newest(self, notice_version: int) -> tuple[int, Loader] | None:
        if notice_version > self._seen:
            self._seen = max(notice_version, weights_io.latest_version(self.run_dir))
        return (self._seen, self._loader(self._seen)) if self._seen >= 0 else None

    def wait(self, version: int, timeout_s: float) -> tuple[int, Loader]:
        deadline = time.monotonic() + timeout_s
        while (latest := weights_io.latest_version(self.run_dir)) < version:
            if time.monotonic() > deadline:
                raise TimeoutError(f"weights v{version} did not appear in {self.run_dir}/weights in {timeout_s:g}s")
            time.sleep(self.poll_s)
        weights_io.wait_for(self.run_dir, latest, timeout_s, self.poll_s)
        self._seen = max(self._seen, latest)
        return latest, self._loader(latest)

    def close(self) -> None:
        pass


class BroadcastWeights:
    """The in-job broadcast (`transport.broadcast`): a thread joins the group as receiver `rank + 1` and keeps
    the newest message; the directory serves the first weights and anything the broadcast has not brought."""

    def __init__(self, run_dir: Path, rank: int, ranks: int, read_rendezvous: Callable[[], dict[str, Any]],
                 timeout_s: float = 600.0, poll_s: float = 0.05) -> None:
        self.dir = DirWeights(run_dir, poll_s)
        self._latest: tuple[int, list[tuple[str, torch.Tensor]]] | None = None
        self._lock = threading.Lock()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._receive, args=(rank, ranks, read_rendezvous, timeout_s),
                                        name="weights-broadcast", daemon=True)
        self._thread.start()

    def _receive(self, rank: int, ranks: int, read: Callable[[], dict[str, Any]], timeout_s: float) -> None:
        from agentrl.transport.broadcast import WeightBroadcast, open_store

        try:
            deadline = time.monotonic() + timeout_s
            while STORE_KEY not in (info := read()):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no {STORE_KEY} in rendezvous.json after {timeout_s:g}s")
                time.sleep(0.1)
            where = info[STORE_KEY]
            store = open_store(where["host"], int(where["port"]), rank + 1, ranks + 1, timeout_s)
            bc = WeightBroadcast(store, rank + 1, ranks + 1, timeout_s=timeout_s)
            while True:
                version, named = bc.receive()
                if version < 0:  # the trainer's last message: no more weights
                    return
                with self._lock:
                    self._latest = (version, named)
        except BaseException as e:  # noqa: BLE001 - the trainer closing the group ends this thread too
            self.error = e

    def _held(self) -> tuple[int, Loader] | None:
        with self._lock:
            if self._latest is None:
                return None
            version, named = self._latest
        return version, lambda: iter(named)

    def newest(self, notice_version: int) -> tuple[int, Loader] | None:
        return self._held()

    def wait(self, version: int, timeout_s: float) -> tuple[int, Loader]:
        held = self._held()
        if held is not None and held[0] >= version:
            return held
        return self.dir.wait(version, timeout_s)

    def close(self) -> None:
        pass  # a daemon thread blocked in a collective: it ends with the process
