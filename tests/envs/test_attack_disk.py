"""The attack player's disk check (`checks.attacks.runner.Watch`, `checks.attacks.disk`) blames the worker's
own processes for what they write and hold, never a neighbour: CI failed db_endless_message for "742 MB of
the host's disk were filled" that a test on the other xdist worker wrote while the attack played."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from agentrl.checks.attacks import disk
from agentrl.checks.attacks.runner import Watch

SIZE = 96 << 20
LIMIT = 48 << 20

WRITER = """
import os, sys
path, size, hold = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "hold"
with open(path, "wb") as f:
    if hold:
        os.unlink(path)  # as SQLite and MariaDB make their temporary files: seen only through the open fd
    for _ in range(size >> 20):
        f.write(os.urandom(1 << 20))
    f.flush()
    os.fsync(f.fileno())
    print("ready", flush=True)
    if hold:
        sys.stdin.readline()
open(path + ".done", "w").close()
"""


def _filled(watch: Watch) -> int:
    return max(free[0] - min(free) for free in watch.free.values())


def test_a_child_holding_an_unlinked_file_is_blamed(tmp_path: Path) -> None:
    watch = Watch(disk_limit=LIMIT)
    watch.sample()
    path = Path(tempfile.gettempdir()) / f"agentrl-disk-{os.getpid()}"
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(SIZE), "hold"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        assert child.pid in disk.tree_pids()
        watch.sample()
    finally:
        child.communicate("\n", timeout=30)
    problems = watch.problems()
    assert any("hold open grew by" in p for p in problems), problems
    if watch.written:  # where the kernel accounts I/O per process, the disk it filled is its own too
        assert watch.written[-1] - watch.written[0] >= SIZE
        if _filled(watch) > LIMIT:
            assert any("were filled while the worker's processes wrote" in p for p in problems), problems


def test_a_reaped_childs_writes_stay_counted_and_a_neighbours_never_are(tmp_path: Path) -> None:
    if disk.written_bytes([os.getpid()]) is None:
        pytest.skip("this kernel does not account I/O per process")
    watch = Watch(disk_limit=LIMIT)
    watch.sample()
    own = tmp_path / "own"
    subprocess.run([sys.executable, "-c", WRITER, str(own), str(SIZE), "write"], check=True, capture_output=True)
    watch.sample()  # the child is gone: its writes count through the parent that reaped it
    assert watch.written[-1] - watch.written[0] >= SIZE
    own.unlink()

    watch = Watch(disk_limit=LIMIT)
    watch.sample()
    theirs = Path(tempfile.gettempdir()) / f"agentrl-neighbour-{os.getpid()}"
    # A neighbour: the shell exits at once and its writer runs on, a child of init, outside this tree.
    subprocess.run(["sh", "-c", f'"{sys.executable}" -c "$0" "$1" "$2" write >/dev/null &', WRITER, str(theirs),
                    str(SIZE)], check=True)
    try:
        deadline = time.monotonic() + 60
        while not Path(f"{theirs}.done").exists():
            assert time.monotonic() < deadline, "the neighbour did not finish"
            watch.sample()
            time.sleep(0.05)
        watch.sample()
        if _filled(watch) < LIMIT:
            pytest.skip("the file system did not show the neighbour's writes as used space")
        assert watch.problems() == []
    finally:
        theirs.unlink(missing_ok=True)
        Path(f"{theirs}.done").unlink(missing_ok=True)
