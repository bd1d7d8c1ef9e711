"""The reaper: what a process started in sessions of their own is stopped when that process dies, however it
dies (SIGKILL included).

A child in a session of its own gets no signal meant for its parent's group, and a parent killed outright (the
OOM killer, `kill -9`, a timeout's SIGKILL, a SIGTERM cut short by the launcher's SIGKILL) runs no exit hook:
the launcher's roles (controller, env workers) and an env worker's private MariaDB server would keep running
and keep their ports and files. So such a process starts one reaper, a small process in a session of its own,
and holds the write end of a pipe to it (`process_reaper`): `+<pgid>` for every group it starts (with a
directory of the group's files to remove after it, `+<pgid>\t<dir>`), `-<pgid>` for every group it has stopped
itself. The kernel closes the pipe when the process exits, whatever the cause; the reaper then SIGTERMs each
group still listed, SIGKILLs what is left after a grace period, and removes the groups' directories.
A process that stopped its own children leaves it nothing to do. A forked child lets go of its parent's pipe.

This file runs as a script (`python -I reaper.py`): standard library only, no package import.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

GRACE_S = 5.0
"""Seconds between the SIGTERM and the SIGKILL of the groups a dead launcher left."""


class Reaper:
    """This process's handle to its reaper process."""

    def __init__(self) -> None:
        read, self._write = os.pipe()  # not inheritable: no role holds the pipe open after its exec
        try:
            self.proc = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__)], stdin=read,
                                         stdout=subprocess.DEVNULL, start_new_session=True)
        finally:
            os.close(read)
        self.owner = os.getpid()

    def watch(self, pgid: int, remove: str | os.PathLike[str] | None = None) -> None:
        """Stop group `pgid` if this process dies first; then also remove the directory `remove`."""
        path = os.path.abspath(remove) if remove is not None else ""
        self._send(f"+{pgid}" + (f"\t{path}" if path and "\n" not in path else "") + "\n")

    def forget(self, pgid: int) -> None:
        self._send(f"-{pgid}\n")

    def _send(self, line: str) -> None:
        try:
            os.write(self._write, line.encode())
        except OSError as e:  # the reaper itself was killed: the run goes on without it
            print(f"[  launcher] the role reaper is gone ({e}): roles are stopped at exit only", file=sys.stderr)

    def close_inherited(self) -> None:
        """In a forked child: let go of the parent's pipe (the parent's reaper must see its parent's exit)."""
        try:
            os.close(self._write)
        except OSError:
            pass


_REAPER: Reaper | None = None


def process_reaper() -> Reaper:
    """This process's reaper, started on first use."""
    global _REAPER
    if _REAPER is None:
        _REAPER = Reaper()
    return _REAPER


def _after_fork_in_child() -> None:
    """A forked child lets go of its parent's pipe (or the parent's death would go unseen while the child lives)
    and starts a reaper of its own if it needs one."""
    global _REAPER
    if _REAPER is not None:
        _REAPER.close_inherited()
        _REAPER = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # the group id was reused by someone else's processes: not ours to stop
        return False


def reap(groups: dict[int, str], grace_s: float = GRACE_S) -> None:
    """SIGTERM every group, SIGKILL those still alive after `grace_s`, then remove the groups' directories."""
    for pgid in groups:
        _signal(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(alive(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pgid in groups:
        _signal(pgid, signal.SIGKILL)
    deadline = time.monotonic() + grace_s
    while any(alive(g) for g in groups) and time.monotonic() < deadline:  # SIGKILL takes effect when scheduled
        time.sleep(0.05)
    for path in groups.values():
        if path:
            shutil.rmtree(path, ignore_errors=True)


def _signal(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def listed(lines) -> dict[int, str]:
    """The groups still to stop (each with its directory to remove, or "") after the `+<pgid>[\t<dir>]` and
    `-<pgid>` lines (others are ignored)."""
    groups: dict[int, str] = {}
    for line in lines:
        head, _, path = line.rstrip(b"\n").partition(b"\t")
        try:
            sign, pgid = head[:1], int(head[1:])
        except ValueError:
            continue
        if pgid <= 1 or sign not in (b"+", b"-"):
            continue
        if sign == b"+":
            groups[pgid] = os.fsdecode(path) if os.path.isabs(os.fsdecode(path)) else ""
        else:
            groups.pop(pgid, None)
    return groups


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the launcher is the launcher's to handle
    reap(listed(sys.stdin.buffer))  # read until every copy of the write end is closed: the launcher is gone


if __name__ == "__main__":
    main()
