"""The reaper: a launcher's roles are stopped when the launcher dies, however it dies (SIGKILL included).

Roles run in sessions of their own, so no signal sent to the launcher reaches them, and a launcher killed
outright (the OOM killer, `kill -9`, a lost terminal's timeout) runs no exit hook: its controller, env workers
and their database servers would keep running and keep their ports. Each launching process therefore starts
one reaper, a small process in a session of its own, and holds the write end of a pipe to it. The launcher
writes `+<pgid>` for every role it starts and `-<pgid>` for every role it has stopped. The kernel closes
the pipe when the launcher exits, whatever the cause; the reaper then SIGTERMs each group still listed and
SIGKILLs what is left after a grace period. A launcher that stopped its own roles leaves it nothing to do.

This file runs as a script (`python -I reaper.py`): standard library only, no package import.
"""
from __future__ import annotations

import os
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

    def watch(self, pgid: int) -> None:
        self._send(f"+{pgid}\n")

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


def alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # the group id was reused by someone else's processes: not ours to stop
        return False


def reap(groups: set[int], grace_s: float = GRACE_S) -> None:
    """SIGTERM every group, then SIGKILL those still alive after `grace_s`."""
    for pgid in groups:
        _signal(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(alive(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pgid in groups:
        _signal(pgid, signal.SIGKILL)


def _signal(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def listed(lines) -> set[int]:
    """The groups still to stop after the launcher's `+<pgid>` / `-<pgid>` lines (others are ignored)."""
    groups: set[int] = set()
    for line in lines:
        try:
            sign, pgid = line[:1], int(line[1:])
        except ValueError:
            continue
        if pgid > 1 and sign in (b"+", b"-"):
            (groups.add if sign == b"+" else groups.discard)(pgid)
    return groups


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the launcher is the launcher's to handle
    reap(listed(sys.stdin.buffer))  # read until every copy of the write end is closed: the launcher is gone


if __name__ == "__main__":
    main()
