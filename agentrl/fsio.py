"""Durable, atomic files: what the run directory's readers rely on (standard library only, so every role and
the launcher on a login node may use it).

A reader of a file written here sees the old content or the new, never a torn file: the data goes to a
temporary file in the same directory, is fsynced, and is renamed over the target; `fsync_dir` then makes
the rename itself survive a crash.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def fsync_dir(directory: str | os.PathLike[str] | Path) -> None:
    """Flush a directory's entries (a rename into it survives a crash only after this)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: str | os.PathLike[str] | Path, data: Any, indent: int | None = None,
                      durable: bool = True) -> Path:
    """Replace `path` with `data` as JSON, atomically (parents are created). `durable=False` skips the two
    fsyncs, for files that are rewritten often and cheap to lose (a notice, a heartbeat)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=indent)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)
    return path
