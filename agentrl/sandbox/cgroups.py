"""A cgroup per sandbox session: one memory and process budget for everything the session makes.

Why: RLIMIT_AS bounds each process, RLIMIT_NPROC the number, and the tmpfs mounts their own sizes, but
nothing bounds their sum: three background processes of 1 GB each plus 1.6 GB of tmpfs pages fit every
one of those limits, and 256 such sessions take a node's memory and get the worker itself killed. A
memory cgroup counts all of it (tmpfs pages are charged to the cgroup of the process that wrote them),
and the kernel's OOM killer then acts inside that cgroup only.

What is here: `detect` (cgroup v1 with the memory and pids hierarchies, or v2, under the worker's own
cgroup, with a probe that a group can be made there) and `SessionCgroup` (make one, join it from a
child before exec, remove it). Where the worker may not make cgroups (a non-root worker without a
delegated subtree, a read-only /sys/fs/cgroup) `detect` says why; the os task logs that once at start
and its sessions run with the per-process limits only (or fail, with `cgroup_required`).
Not here: the sandbox itself (`agentrl.sandbox.shell`).
"""
from __future__ import annotations

import logging
import os
import secrets
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

ROOT = Path("/sys/fs/cgroup")

REMOVE_WAIT_S = 20.0
"""How long closing a session waits for its cgroup to empty (below the worker's deadline for a call)."""
REAP_FOR_S = 600.0
"""How long the background reaper keeps trying to remove a cgroup a session left behind."""


@dataclass(frozen=True)
class CgroupSupport:
    """Where session cgroups are made: {"memory": dir, "pids": dir} (v1) or {"unified": dir} (v2); none
    with `reason` saying why not."""

    kind: str | None
    parents: dict[str, Path] = field(default_factory=dict)
    reason: str = ""


def _own_paths(proc_cgroup: str) -> dict[str, str]:
    """controller -> this process's cgroup path ("" for v2's unified line)."""
    out = {}
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path
    return out


def detect(root: Path = ROOT, proc_cgroup: str | None = None) -> CgroupSupport:
    """Whether this worker can make a memory+pids cgroup per session under its own cgroup (probed)."""
    try:
        own = _own_paths(proc_cgroup if proc_cgroup is not None else Path("/proc/self/cgroup").read_text())
    except (OSError, ValueError) as e:
        return CgroupSupport(None, reason=f"cannot read /proc/self/cgroup ({e})")
    if (root / "memory").is_dir() and (root / "pids").is_dir() and "memory" in own and "pids" in own:
        parents = {c: root / c / own[c].lstrip("/") for c in ("memory", "pids")}
        kind = "v1"
    elif (root / "cgroup.controllers").is_file() and "" in own:
        parents = {"unified": root / own[""].lstrip("/")}
        kind = "v2"
        enabled = (parents["unified"] / "cgroup.subtree_control").read_text().split() \
            if (parents["unified"] / "cgroup.subtree_control").is_file() else []
        if not {"memory", "pids"} <= set(enabled):
            return CgroupSupport(None, reason=f"cgroup v2: memory and pids are not enabled for children of "
                                              f"{parents['unified']} (cgroup.subtree_control: {enabled})")
    else:
        return CgroupSupport(None, reason="no cgroup v1 memory+pids hierarchy and no cgroup v2 here")
    try:
        probe = SessionCgroup(CgroupSupport(kind, parents), "agentrl-probe", 64 << 20, 8)
        probe.remove()
    except OSError as e:
        return CgroupSupport(None, reason=f"cannot make a cgroup under {', '.join(map(str, parents.values()))} "
                                          f"({e.strerror or e})")
    return CgroupSupport(kind, parents)


class SessionCgroup:
    """One session's cgroup: memory at most `memory_bytes` (swap included where the kernel counts it),
    at most `pids` tasks. Made at once; `join_self()` is called in the child before exec; `remove()` when
    the session's processes are gone."""

    def __init__(self, support: CgroupSupport, name: str, memory_bytes: int, pids: int) -> None:
        if support.kind is None:
            raise OSError(f"no cgroups: {support.reason}")
        self.name = f"{name}-{secrets.token_hex(4)}"
        self.dirs = [p / self.name for p in support.parents.values()]
        made: list[Path] = []
        try:
            for d in self.dirs:
                d.mkdir()
                made.append(d)
            if support.kind == "v1":
                mem, pid = self.dirs
                (mem / "memory.limit_in_bytes").write_text(str(memory_bytes))
                if (mem / "memory.memsw.limit_in_bytes").exists():  # swap too, where accounted
                    (mem / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
                (pid / "pids.max").write_text(str(pids))
            else:
                (self.dirs[0] / "memory.max").write_text(str(memory_bytes))
                (self.dirs[0] / "memory.swap.max").write_text("0")
                (self.dirs[0] / "pids.max").write_text(str(pids))
        except OSError:
            for d in reversed(made):
                try:
                    d.rmdir()
                except OSError:
                    pass
            raise
        self.procs = [str(d / "cgroup.procs") for d in self.dirs]
        memory = self.dirs[0]
        self.memory_files = ((memory / "memory.usage_in_bytes", memory / "memory.stat") if support.kind == "v1"
                             else (memory / "memory.current", memory / "memory.stat"))
        """The session's memory usage and its breakdown, which the session's /proc/meminfo is made of."""

    def join_self(self) -> None:
        """Move the calling process into this cgroup (a forked child, before exec: its whole tree follows)."""
        for path in self.procs:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)

    def remove(self, wait_s: float = REMOVE_WAIT_S) -> None:
        """Kill whatever is left in the cgroup, wait until it is empty and remove it, child groups first.

        A session's processes can take seconds to go after the kill (the kernel frees a tmpfs of a million
        directories when the last of them exits), so this waits up to `wait_s` (the caller's slot stays
        taken meanwhile: the session that made the mess pays for it). Past that the cgroup is handed to
        a background reaper that keeps trying for `REAP_FOR_S` (`pending()` counts them), and OSError says so.
        """
        deadline = time.monotonic() + wait_s
        left = _remove_tree(self.dirs, deadline)
        if left:
            _reaper.add(left)
            raise OSError(f"cgroup {self.name} still held processes after {wait_s:g} s; a background reaper "
                          f"keeps removing it")


def _kill_members(d: Path) -> bool:
    """SIGKILL every process of cgroup `d` and its children (`cgroup.kill` where the kernel has it);
    True when none is left."""
    kill = d / "cgroup.kill"
    if kill.exists():
        try:
            kill.write_text("1")
        except OSError:
            pass
    empty = True
    for sub, _, _ in os.walk(d, topdown=False):
        try:
            pids = [int(p) for p in (Path(sub) / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            continue
        for pid in pids:
            empty = False
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    return empty


def _remove_tree(dirs: list[Path], deadline: float) -> list[Path]:
    """Remove each cgroup directory of `dirs` with its child groups (deepest first), killing what is in them;
    retried until `deadline`. Returns those still there."""
    left = [d for d in dirs if d.exists()]
    while left:
        still = []
        for d in left:
            _kill_members(d)
            for sub, _, _ in os.walk(d, topdown=False):
                try:
                    os.rmdir(sub)
                except FileNotFoundError:
                    pass
                except OSError:
                    still.append(d)
                    break
        left = [d for d in dict.fromkeys(still) if d.exists()]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return left


class _Reaper:
    """Removes, in the background, the cgroups sessions left behind (every second, up to `REAP_FOR_S`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queue: dict[Path, float] = {}
        self.thread: threading.Thread | None = None

    def add(self, dirs: list[Path]) -> None:
        with self.lock:
            for d in dirs:
                self.queue.setdefault(d, time.monotonic() + REAP_FOR_S)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="cgroup-reaper", daemon=True)
                self.thread.start()

    def pending(self) -> int:
        with self.lock:
            return len(self.queue)

    def _run(self) -> None:
        while True:
            with self.lock:
                work = list(self.queue.items())
                if not work:
                    self.thread = None
                    return
            for d, until in work:
                left = _remove_tree([d], time.monotonic() + 1.0)
                gave_up = bool(left) and time.monotonic() > until
                if gave_up:
                    log.error("gave up removing cgroup %s after %g s: it still holds processes", d, REAP_FOR_S)
                if not left or gave_up:
                    with self.lock:
                        self.queue.pop(d, None)
            time.sleep(1.0)


_reaper = _Reaper()


def pending() -> int:
    """Cgroups of ended sessions the background reaper is still removing."""
    return _reaper.pending()
