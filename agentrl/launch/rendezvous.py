"""rendezvous.json in the run dir: how roles find each other (the controller's address, the pipeline's keys below).

Writers merge their keys atomically (write a temp file, fsync, rename), so readers never see a torn file.
Standard library only: this runs on login nodes too.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from agentrl.fsio import write_json_atomic

FILENAME = "rendezvous.json"
PIPELINE_KEYS = ("mpi_port", "weights_store", "file_channel")
"""Keys the pipeline's trainer publishes (the weight broadcast's store, the file channel's nonce), cleared
before the pipeline or its trainer restarts; tests check they are `weight_sources.STORE_KEY` and
`file_channel.CHANNEL_KEY`. "mpi_port", published by earlier versions' MPI port mode, is cleared too, for their
run dirs."""


def read(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / FILENAME
    if not path.exists():
        return {}
    return json.loads(path.read_text())


def publish(run_dir: str | Path, **entries: Any) -> None:
    """Merge `entries` into rendezvous.json (single writer per key; the rename is atomic)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    data = read(run_dir)
    data.update(entries)
    _write(run_dir, data)


def _write(run_dir: Path, data: dict[str, Any]) -> None:
    write_json_atomic(run_dir / FILENAME, data, indent=2)


def remove(run_dir: str | Path, *keys: str) -> None:
    """Drop `keys` (addresses of a role that is being restarted: nobody may reach for the dead one)."""
    data = read(run_dir)
    if any(k in data for k in keys):
        _write(Path(run_dir), {k: v for k, v in data.items() if k not in keys})


def clear_pipeline(run_dir: str | Path) -> list[str]:
    """Drop the pipeline's keys (`PIPELINE_KEYS`) before its MPI world starts again: the new trainer publishes
    its own, and no rank may reach for the dead one's. Returns the keys that were there."""
    present = [k for k in PIPELINE_KEYS if k in read(run_dir)]
    remove(run_dir, *PIPELINE_KEYS)
    return present


def wait_for(run_dir: str | Path, key: str, timeout_s: float = 120.0, poll_s: float = 0.05) -> Any:
    """Block until `key` appears in rendezvous.json; TimeoutError names the key and the file."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = read(run_dir).get(key)
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{key!r} did not appear in {Path(run_dir) / FILENAME} within {timeout_s:.0f}s")
        time.sleep(poll_s)
