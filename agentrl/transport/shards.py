"""HDF5 shards of trajectories: the persisted record of every rollout, and the trajectory channel of
the synchronous schedule (docs/architecture.md §3, §6, §8: `runs/<name>/shards/<role>-<rank>/<seq>.h5`).

One shard is one HDF5 file holding N trajectories, one row per trajectory in each dataset:

    tokens int32, loss_mask uint8, logprobs float32, policy_version int32, engine int16
                                        variable-length rows (h5py vlen), so row i reads alone: ds[i]
    reward float32, num_turns int32     [N]
    traj_id, task, index, group_id, status        [N] utf-8 variable-length strings
    timings, metrics                    [N] JSON strings (dict[str, float])
    attrs: schema_version, num_trajectories, created (ISO 8601 UTC)

Writes are atomic: a hidden temp file in the same directory (`.<name>.<random>.tmp`, which never
matches the reader's `NNNNNN.h5` pattern) is written, fsynced and `os.replace`d onto its final name,
and the directory is fsynced. A crash leaves either the whole shard or no shard under the final name.
Each directory has one writer (docs/architecture.md §6), so sequence numbers need no lock.

Each rank writes its own directory, `shard_dir(run_dir, "rollout", rank)`; segments are numbered from
0 and a restarted writer continues after the highest segment present (removing temp files a crash left),
so numbering survives restarts and nothing is overwritten. Readers may list and read segments while the
writer runs (`ShardReader.scan`); a restarted trainer drains every rank's directory (`rank_dirs`).

This module is not the MPI channel and keeps no ledger of consumed trajectories (the trainer does).
"""
from __future__ import annotations

import json
import os
import re
import secrets
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from agentrl.fsio import fsync_dir
from agentrl.types import SCHEMA_VERSION, Status, Trajectory

ARRAYS: dict[str, type[np.generic]] = {
    "tokens": np.int32, "loss_mask": np.uint8, "logprobs": np.float32,
    "policy_version": np.int32, "engine": np.int16,
}
SCALARS: dict[str, type[np.generic]] = {"reward": np.float32, "num_turns": np.int32}
STRINGS: tuple[str, ...] = ("traj_id", "task", "index", "group_id", "status")
JSONS: tuple[str, ...] = ("timings", "metrics")
SHARD_NAME = re.compile(r"^(\d{6,})\.h5$")
TEMP_NAME = re.compile(r"^\.\d{6,}\.h5\.[0-9a-f]+\.tmp$")


def shard_dir(run_dir: str | os.PathLike[str], role: str, rank: int) -> Path:
    """`run_dir/shards/<role>-<rank>`: the directory of one writer (docs/architecture.md §8)."""
    return Path(run_dir) / "shards" / f"{role}-{rank}"


def rank_dirs(run_dir: str | os.PathLike[str], role: str) -> dict[int, Path]:
    """The shard directories of every rank of `role` present under `run_dir/shards`, by rank."""
    root = Path(run_dir) / "shards"
    pattern = re.compile(rf"^{re.escape(role)}-(\d+)$")
    found = {int(m.group(1)): p for p in root.iterdir() if (m := pattern.match(p.name)) and p.is_dir()} \
        if root.is_dir() else {}
    return dict(sorted(found.items()))


class ShardError(Exception):
    """A shard that cannot be read: unknown schema version, missing dataset, truncated or corrupt."""


def _open(path: Path, mode: str) -> h5py.File:
    # Shards are never opened by a reader while written (atomic rename), so HDF5's file locking buys
    # nothing and fails on some shared filesystems (NFS, Lustre without flock).
    return h5py.File(path, mode, locking=False)


def _fill(f: h5py.File, trajectories: Sequence[Trajectory]) -> None:
    n = len(trajectories)
    f.attrs["schema_version"] = SCHEMA_VERSION
    f.attrs["num_trajectories"] = n
    f.attrs["created"] = datetime.now(UTC).isoformat()
    for name, dtype in ARRAYS.items():
        rows = np.empty(n, dtype=object)  # filled one by one: equal lengths must not become a 2-D array
        for i, t in enumerate(trajectories):
            rows[i] = np.asarray(getattr(t, name), dtype=dtype)
        f.create_dataset(name, shape=(n,), dtype=h5py.vlen_dtype(dtype), data=rows)  # not ds[...] = rows:
        # that assignment mis-broadcasts a single empty row (h5py: "Can't broadcast (1, 0) -> (1,)")
    for name, dtype in SCALARS.items():
        f.create_dataset(name, data=np.array([getattr(t, name) for t in trajectories], dtype=dtype))
    text = h5py.string_dtype("utf-8")
    strings = {name: [str(getattr(t, name)) for t in trajectories] for name in STRINGS}
    strings["status"] = [Status(t.status).value for t in trajectories]
    strings.update({name: [json.dumps(getattr(t, name)) for t in trajectories] for name in JSONS})
    for name, values in strings.items():
        f.create_dataset(name, data=np.array(values, dtype=object), dtype=text)


def write_shard(path: str | os.PathLike[str], trajectories: Sequence[Trajectory]) -> None:
    """Write `trajectories` to the shard `path`, atomically (temp file, fsync, rename, fsync dir).

    Args:
        path: final file name; its directory must exist. An existing file is replaced.
        trajectories: any number, including none.
    """
    path = Path(path)
    # Named here rather than by mkstemp so the shard gets the umask's permissions, not 0600.
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
    try:
        with _open(tmp, "w-") as f:
            _fill(f, trajectories)
        fd = os.open(tmp, os.O_RDWR)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def read_shard(path: str | os.PathLike[str], rows: Sequence[int] | None = None) -> list[Trajectory]:
    """Read the trajectories of a shard (all of them, or only `rows`, without reading the others).

    Args:
        path: shard file.
        rows: indices of the trajectories to read, in the order wanted; None for all.

    Returns:
        The trajectories, in file order (or `rows` order).

    Raises:
        FileNotFoundError: no file at `path`.
        ShardError: unknown schema version, missing dataset or attribute, inconsistent lengths,
            truncated or corrupt file. The message names the file.
        IndexError: a row of `rows` is out of range.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no shard at {path}")
    try:
        with _open(path, "r") as f:
            version = f.attrs.get("schema_version")
            if version is None or int(version) != SCHEMA_VERSION:
                raise ShardError(f"{path}: schema_version {version!r}, this code reads {SCHEMA_VERSION}")
            n = int(f.attrs["num_trajectories"])
            names = (*ARRAYS, *SCALARS, *STRINGS, *JSONS)
            missing = [name for name in names if name not in f]
            if missing:
                raise ShardError(f"{path}: missing datasets {missing}")
            bad = [name for name in names if f[name].shape != (n,)]
            if bad:
                raise ShardError(f"{path}: datasets {bad} do not have num_trajectories={n} rows")
            index = list(range(n)) if rows is None else [int(i) for i in rows]
            if any(not 0 <= i < n for i in index):
                raise IndexError(f"{path}: rows {list(index)} out of range for {n} trajectories")
            cols: dict[str, list[Any]] = {}
            for name in names:
                ds = f[name].asstr() if name in STRINGS or name in JSONS else f[name]
                cols[name] = [ds[i] for i in index] if rows is not None else list(ds[...])
    except (ShardError, IndexError):
        raise
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as e:  # h5py on damaged files
        raise ShardError(f"{path}: unreadable shard ({type(e).__name__}: {e})") from e
    try:
        return [_trajectory(cols, j) for j in range(len(index))]
    except ValueError as e:  # unequal row lengths, unknown status, bad JSON
        raise ShardError(f"{path}: invalid trajectory ({e})") from e


def _trajectory(cols: dict[str, list[Any]], j: int) -> Trajectory:
    """Row j of the columns read from a shard, as a Trajectory (which checks the row lengths)."""
    return Trajectory(
        traj_id=str(cols["traj_id"][j]), task=str(cols["task"][j]), index=str(cols["index"][j]),
        group_id=str(cols["group_id"][j]), status=Status(str(cols["status"][j])),
        tokens=cols["tokens"][j], loss_mask=cols["loss_mask"][j], logprobs=cols["logprobs"][j],
        policy_version=cols["policy_version"][j], engine=cols["engine"][j],
        reward=float(cols["reward"][j]), num_turns=int(cols["num_turns"][j]),
        timings=json.loads(cols["timings"][j]), metrics=json.loads(cols["metrics"][j]),
    )


class ShardWriter:
    """Writes numbered shards `000000.h5`, `000001.h5`, ... into one directory (one writer per dir).

    On construction it continues after the highest segment present and deletes the temp files that a
    killed writer of this directory left (safe: a directory has one writer, and it is this one now).
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        existing = []
        for p in self.directory.iterdir():
            if m := SHARD_NAME.match(p.name):
                existing.append(int(m.group(1)))
            elif TEMP_NAME.match(p.name):
                p.unlink(missing_ok=True)
        self.next_seq: int = max(existing) + 1 if existing else 0

    def write(self, trajectories: Sequence[Trajectory]) -> Path:
        """Write the next shard; returns its path."""
        path = self.directory / f"{self.next_seq:06d}.h5"
        write_shard(path, trajectories)
        self.next_seq += 1
        return path


class ShardReader:
    """Reads the numbered shards of one directory, possibly while its writer is still adding them."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def path(self, seq: int) -> Path:
        return self.directory / f"{seq:06d}.h5"

    def available(self) -> list[Path]:
        """Complete shards present now, in sequence order (temp files never match)."""
        if not self.directory.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.directory.iterdir() if (m := SHARD_NAME.match(p.name))]
        return [p for _, p in sorted(found)]

    def read(self, seq: int) -> list[Trajectory]:
        """All trajectories of shard `seq`; FileNotFoundError if it is not there."""
        return read_shard(self.path(seq))

    def scan(self, start: int = 0) -> Iterator[tuple[int, list[Trajectory]]]:
        """(seq, trajectories) of every complete shard with seq ≥ `start` present now, in order.

        Safe while the writer runs: a shard appears under its name only once complete. To follow a
        live writer, call again with `start` = the last seq seen + 1.
        """
        for path in self.available():
            seq = int(path.name.removesuffix(".h5"))
            if seq >= start:
                yield seq, read_shard(path)

    def wait(self, seq: int, timeout_s: float, poll_s: float = 0.5) -> list[Trajectory]:
        """Block until shard `seq` exists, then read it.

        Raises:
            TimeoutError: the shard did not appear within `timeout_s` seconds.
        """
        path = self.path(seq)
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"shard {path.name} did not appear in {self.directory} within {timeout_s:g} s")
            time.sleep(min(poll_s, remaining))
        return read_shard(path)
