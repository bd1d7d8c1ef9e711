"""What a worker's own processes do to the host's disk, told apart from what its neighbours do.

A file system's free space is shared: on a CI runner or a cluster node other jobs' checkpoints, caches and
test files fill it too, so a drop in free space alone does not say who filled it (CI failed an attack for
742 MB that a neighbouring test wrote). Two counts here belong to the worker's process tree alone:
  * written: what the tree wrote to storage and did not take back, from the kernel's per-process I/O
    accounting (/proc/<pid>/io, `write_bytes - cancelled_write_bytes`). A buffered write is counted when
    its page is dirtied, not at write-back; a dirty page truncated or unlinked before write-back is taken
    back; a reaped child's counts are added to its parent's, so sessions that came and went still count;
  * held: the blocks of the regular files its processes hold open, each inode once. A temporary file
    unlinked as soon as it is made (SQLite's and MariaDB's are) is seen only this way, and so is a file on
    a tmpfs, which the I/O accounting does not count.
"""
from __future__ import annotations

import os
import stat


def tree_pids(root: int | None = None) -> list[int]:
    """`root` (this process by default) and every live process descended from it."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):  # gone since the listing
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def written_bytes(pids: list[int]) -> int | None:
    """Bytes the processes (and the children they reaped) wrote to storage net of what they took back; None
    when the kernel does not account I/O per process or the first pid's accounting cannot be read."""
    total = 0
    for i, pid in enumerate(pids):
        try:
            with open(f"/proc/{pid}/io") as f:
                counts = dict(line.split(": ", 1) for line in f.read().splitlines() if ": " in line)
            total += int(counts["write_bytes"]) - int(counts["cancelled_write_bytes"])
        except (OSError, KeyError, ValueError):
            if i == 0:
                return None
    return total


def held_bytes(pids: list[int]) -> int:
    """Bytes allocated to the regular files the processes hold open (each file once, unlinked ones too)."""
    seen: dict[tuple[int, int], int] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                st = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    return sum(seen.values())
