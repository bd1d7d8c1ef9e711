"""A launching process that ends without reaching its own `stop_all` still stops its roles: they run in
sessions of their own, and `jobs.eval` killed by SIGTERM (a SystemExit inside its event loop skipped the
`finally` that stops them) left an env worker and its MariaDB server running."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def test_roles_are_stopped_when_the_launcher_is_terminated(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pgid = int(proc.stdout.readline())
    try:
        time.sleep(0.5)
        assert _alive(pgid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while _alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pgid), "the role's group outlived its launcher"
    finally:
        if _alive(pgid):
            os.killpg(pgid, signal.SIGKILL)
        proc.kill()


def _wait_gone(pgid: int, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while _alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _alive(pgid)


def test_roles_are_stopped_when_the_launcher_is_killed_outright(tmp_path: Path) -> None:
    """SIGKILL runs no exit hook: the launcher's reaper sees the pipe close and stops the role's whole group."""
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pgid = int(proc.stdout.readline())
    try:
        time.sleep(0.5)
        assert _alive(pgid)
        proc.kill()
        assert proc.wait(timeout=30) == -signal.SIGKILL
        assert _wait_gone(pgid), "the role's group outlived its SIGKILLed launcher"
    finally:
        if _alive(pgid):
            os.killpg(pgid, signal.SIGKILL)
        proc.kill()


def test_a_forked_child_of_the_launcher_does_not_keep_its_death_from_the_reaper(tmp_path: Path) -> None:
    script = LAUNCH.replace("time.sleep(300)", "import os\nif os.fork() == 0:\n    print(os.getpid(), flush=True)\n"
                                               "    time.sleep(300)\n    os._exit(0)\ntime.sleep(300)")
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    pgid, child = int(proc.stdout.readline()), int(proc.stdout.readline())
    try:
        proc.kill()  # its forked child sleeps on, holding whatever the fork handed it
        assert _wait_gone(pgid), "a forked child kept the launcher's reaper from seeing it die"
    finally:
        if _alive(pgid):
            os.killpg(pgid, signal.SIGKILL)
        proc.kill()
        os.kill(child, signal.SIGKILL)


def test_the_reaper_stops_only_the_groups_still_listed() -> None:
    """A role the launcher stopped itself is forgotten: its group id may belong to someone else by then."""
    from agentrl.launch.reaper import listed

    assert listed([b"+500\n", b"+700\n", b"-500\n", b"garbage\n", b"+1\n", b"+-3\n", b"*9\n", b"+0\n"]) == {700}
