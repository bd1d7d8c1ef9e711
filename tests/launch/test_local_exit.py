"""A launching process that ends without reaching its own `stop_all` still stops its roles: they run in
sessions of their own, and `jobs.eval` killed by SIGTERM (a SystemExit inside its event loop skipped the
`finally` that stops them) left an env worker and its MariaDB server running."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agentrl.reaper import alive, listed

ROOT = Path(__file__).resolve().parents[2]

LAUNCH = """
import signal, sys, time
from pathlib import Path
from agentrl.launch.local import LocalLauncher

def stop(signum, frame):
    raise SystemExit(128 + signum)

signal.signal(signal.SIGTERM, stop)
def start():  # the launcher is nobody's once this returns, as in a coroutine torn down mid-flight
    launcher = LocalLauncher(Path(sys.argv[1]))
    return launcher.start_command("sleeper", ["sh", "-c", "sleep 300 & sleep 300"]).proc.pid

print(start(), flush=True)
time.sleep(300)
"""


@contextmanager
def launched(tmp_path: Path, script: str = LAUNCH) -> Iterator[tuple[subprocess.Popen, list[int]]]:
    """A launcher process running `script` with a live role: (the process, the ids it printed: the role's group
    first). Whatever is left is killed afterwards."""
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    ids = [int(proc.stdout.readline()) for _ in range(script.count("flush=True"))]
    try:
        yield proc, ids
    finally:
        if alive(ids[0]):
            os.killpg(ids[0], signal.SIGKILL)
        proc.kill()
        for pid in ids[1:]:
            os.kill(pid, signal.SIGKILL)


def gone(pgid: int, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not alive(pgid)


def test_roles_are_stopped_when_the_launcher_is_terminated(tmp_path: Path) -> None:
    with launched(tmp_path) as (proc, (pgid,)):
        time.sleep(0.5)
        assert alive(pgid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        assert gone(pgid, 10), "the role's group outlived its launcher"


def test_roles_are_stopped_when_the_launcher_is_killed_outright(tmp_path: Path) -> None:
    """SIGKILL runs no exit hook: the launcher's reaper sees the pipe close and stops the role's whole group."""
    with launched(tmp_path) as (proc, (pgid,)):
        time.sleep(0.5)
        assert alive(pgid)
        proc.kill()
        assert proc.wait(timeout=30) == -signal.SIGKILL
        assert gone(pgid), "the role's group outlived its SIGKILLed launcher"


def test_a_forked_child_of_the_launcher_does_not_keep_its_death_from_the_reaper(tmp_path: Path) -> None:
    script = LAUNCH.replace("time.sleep(300)", "import os\nif os.fork() == 0:\n    print(os.getpid(), flush=True)\n"
                                               "    time.sleep(300)\n    os._exit(0)\ntime.sleep(300)")
    with launched(tmp_path, script) as (proc, (pgid, _child)):
        proc.kill()  # its forked child sleeps on, holding whatever the fork handed it
        assert gone(pgid), "a forked child kept the launcher's reaper from seeing it die"


def test_the_reaper_stops_only_the_groups_still_listed() -> None:
    """A role the launcher stopped itself is forgotten: its group id may belong to someone else by then."""
    lines = [b"+500\n", b"+700\n", b"-500\n", b"garbage\n", b"+1\n", b"+-3\n", b"*9\n", b"+0\n", b"+800\t/tmp/x y\n",
             b"+900\trelative\n"]
    assert listed(lines) == {700: "", 800: "/tmp/x y", 900: ""}  # only an absolute directory is ever removed
