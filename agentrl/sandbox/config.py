"""How `os` sessions are isolated and limited (`SandboxConfig`), and what this host allows them.

What is here: the sandbox's errors; its configuration; the choice of backend (`select_backend`:
Apptainer when it is installed, bubblewrap otherwise, a clear `SandboxUnavailable` when neither is there
and isolation was asked for); the checks a worker makes at start (`check_image`, `check_cgroups`: a
cgroup per session where the worker may make one); and the host's process budget (`session_budget`,
`check_slots`). Not here: the session's file system (`agentrl.sandbox.layout`) and the session
itself (`agentrl.sandbox.shell.Shell`).
"""
from __future__ import annotations

import functools
import logging
import os
import resource
import shutil
from dataclasses import dataclass
from pathlib import Path

from agentrl.sandbox.cgroups import CgroupSupport
from agentrl.sandbox.cgroups import detect as detect_cgroups
from agentrl.sandbox.rootfs import default_rootfs_dir, require_rootfs

log = logging.getLogger("agentrl.sandbox")

BACKENDS = ("auto", "apptainer", "bwrap", "none")
DOCKER_NOFILE = 1 << 20


class SandboxUnavailable(RuntimeError):
    """The sandbox that was asked for cannot run on this machine."""


class SandboxError(RuntimeError):
    """A session's sandbox failed (did not start, its limits could not be set, its driver died)."""


@dataclass(frozen=True)
class SandboxConfig:
    """How sessions are isolated and limited.

    backend: auto (apptainer, else bwrap, else an error) | apptainer | bwrap | none (no isolation).
    image: bubblewrap: the root file system directory ("" = `agentrl.sandbox.rootfs.default_rootfs_dir()`,
        built by `python -m jobs.make_rootfs`); Apptainer: the image (.sif or sandbox dir; required).
    isolation: when True, "none" is never chosen and a missing sandbox raises SandboxUnavailable.
    """

    backend: str = "auto"
    image: str = ""
    isolation: bool = True
    command_timeout_s: float = 10.0
    max_output_bytes: int = 1 << 20
    nproc: int = 64
    """Processes (and threads) per session; `pid_fraction` of the host's pid_max bounds slots x nproc."""
    memory_mb: int = 2048
    file_size_mb: int = 256
    open_files: int = 0
    """RLIMIT_NOFILE; 0 = Docker's 1048576 (AgentBench's runtime; some of its samples open fd 123321)
    for a worker with CAP_SYS_RESOURCE, which may raise its hard limit (up to the kernel's nr_open),
    else the worker's own hard limit (a root worker in a container may lack the capability)."""
    ptys: int = 16
    """Pseudo-terminals per session: its own devpts instance with this maximum (bubblewrap). The kernel
    counts ptys host-wide (`kernel.pty.nr`, at most `kernel.pty.max` less `kernel.pty.reserve` outside the
    host's own instance), so `host_share` of those over `ptys` bounds the sessions at once."""
    host_share: float = 0.5
    """Of each host-wide kernel table sessions draw on (the open-file table `fs.file-max`, the ptys), the
    part all live sessions together may hold: each session's share is this over `session_budget`."""
    cpu_s: int = 3600
    disk_mb: int = 512
    """Size of the session's writable root (a tmpfs: host memory, allocated as it is used)."""
    writable_bin: bool = True
    """bubblewrap: the session gets its own copies of /usr/bin and /usr/sbin, as AgentBench's container
    (whose root may `chmod u+s /usr/bin/find` or replace a tool), at ~43 MB of memory per session for the
    default image (tmpfs mounts over the image's, each with `disk_mb` of room); graders still run the
    image's own tools, beneath. False leaves the image's read-only (less memory; samples that change a
    system tool then fail)."""
    shm_mb: int = 64
    pid_fraction: float = 0.5
    host_uid: int = 65534
    """The uid bubblewrap runs as when the worker is root and `uid_count` is 1 (see the module docstring)."""
    uid_base: int = 2_000_000_000
    """A root worker's bubblewrap sandboxes: inside ids 0..uid_count-1 are these host uids (no user's)."""
    uid_count: int = 65536
    """How many ids a root worker maps into its bubblewrap sandboxes (1: only root, as host_uid). Each live
    session gets a range of its own (`uid_range`): the kernel counts pipe pages, keys and processes per
    host uid, so sessions that shared one would share those budgets."""
    user_uids: int = 8
    """Regular users (uids 1000, 1001, ... as `useradd` makes them) a session's processes may become, beside
    root and nobody (bubblewrap with the seccomp filter: `seccomp.real_uids`). The kernel bounds the files
    parked in Unix sockets per real uid, to RLIMIT_NOFILE each: every such uid is one more holder of the
    session's share of the open-file table (`holders`)."""
    seccomp: bool = True
    """bubblewrap: the seccomp filter of `agentrl.sandbox.seccomp` (no kernel keys, inotify, fanotify,
    pipe growth, message queues, io_uring, ...: kernel objects shared with other sessions and the host)."""
    fakeroot: bool = True
    """Apptainer: `--fakeroot` (root inside, a uid range mapped; needs subuid entries or root)."""
    session_memory_mb: int = 2048
    """A cgroup per session (`agentrl.sandbox.cgroups`) bounds all it makes, processes and tmpfs pages
    together, to this (pids to `nproc` + 8); 0: none. Where the worker may not make cgroups, sessions run
    with the per-process limits only, said once at start (or fail to start with `cgroup_required`)."""
    cgroup_required: bool = False
    hostname: str = "agentrl-sandbox"
    work_dir: str = ""
    """backend "none" only: where session directories are made ("" = the temp dir)."""

    def __post_init__(self) -> None:
        """Values no type rules out, each a ValueError "field: why" (the config loader names the full path:
        `envs.task_options.os.sandbox.command_timeout_s: must be > 0, got 0.0`)."""
        if self.backend not in BACKENDS:
            raise ValueError(f"backend: unknown sandbox backend {self.backend!r} ({' | '.join(BACKENDS)})")
        for name in ("command_timeout_s", "host_share", "pid_fraction"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)}")
        for name in ("host_share", "pid_fraction"):
            if getattr(self, name) > 1:
                raise ValueError(f"{name}: must be at most 1, got {getattr(self, name)}")
        for name in ("max_output_bytes", "nproc", "memory_mb", "file_size_mb", "ptys", "cpu_s", "disk_mb", "shm_mb",
                     "uid_count"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("open_files", "session_memory_mb"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0 (0: {'Docker' if name == 'open_files' else 'none'}), "
                                 f"got {getattr(self, name)}")
        if not 0 <= self.user_uids <= 1024:
            raise ValueError(f"user_uids: must be within 0..1024, not {self.user_uids}")

    def many_uids(self, backend: str) -> bool:
        """Whether sessions get a range of user ids (`userns.py`): bwrap under a root worker."""
        return backend == "bwrap" and os.geteuid() == 0 and self.uid_count > 1

    def sandbox_uid(self, backend: str) -> int | None:
        """The host uid the sandbox's root runs as (None: this process's own)."""
        if os.geteuid() != 0 or backend == "none":
            return None
        return self.uid_base if self.many_uids(backend) else self.host_uid

    def uid_range(self, slot: int) -> int:
        """The first host uid of session slot `slot`'s range (ranges of `uid_count` from `uid_base`, as many
        as fit below 2**32 - 1; slots beyond wrap around and share)."""
        ranges = max(1, (2**32 - 2 - self.uid_base) // max(self.uid_count, 1))
        return self.uid_base + (slot % ranges) * self.uid_count

    def nofile(self, host_file_max: int | None = None) -> int:
        """The sessions' RLIMIT_NOFILE (see `open_files`): with 0, also at most the session's share of the
        host's open-file table over what may hold them (`holders`, `file_share`), so that no session can fill
        the table."""
        if self.open_files:
            return self.open_files
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        wanted = max(hard, min(DOCKER_NOFILE, nr_open())) if has_capability(CAP_SYS_RESOURCE) else hard
        share = file_share(self, host_file_max) - (self.user_uids + 2) * SCM_MAX_FD
        return max(1, min(wanted, share // self.holders()))

    def holders(self) -> int:
        """What may hold open files of one session at once, each up to RLIMIT_NOFILE: its processes, and the
        files it parks in Unix sockets (SCM_RIGHTS), which the kernel bounds per real uid (`user_uids` + 2)."""
        return self.processes() + self.user_uids + 2

    def processes(self) -> int:
        """What may hold open files in one session at once: its `nproc`, and the launcher, bubblewrap and
        the driver (the cgroup's pid limit)."""
        return self.nproc + CGROUP_EXTRA_PIDS

    def image_dir(self) -> Path:
        return Path(self.image).expanduser() if self.image else default_rootfs_dir()


def select_backend(requested: str = "auto", isolation: bool = True) -> str:
    """The backend to use: `requested` if it is available, or the best available one for "auto"."""
    if requested not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {requested!r} (one of {', '.join(BACKENDS)})")
    if requested == "none":
        if isolation:
            raise SandboxUnavailable("sandbox backend 'none' runs commands on the host; set isolation off to use it")
        return "none"
    if requested == "apptainer" and not apptainer_binary():
        raise SandboxUnavailable("Apptainer was asked for but neither `apptainer` nor `singularity` is on PATH")
    if requested == "bwrap" and not shutil.which("bwrap"):
        raise SandboxUnavailable("bubblewrap was asked for but `bwrap` is not on PATH "
                                 "(Debian/Ubuntu: apt-get install bubblewrap)")
    if requested != "auto":
        return requested
    if apptainer_binary():
        return "apptainer"
    if shutil.which("bwrap"):
        return "bwrap"
    if isolation:
        raise SandboxUnavailable("no sandbox available: install Apptainer or bubblewrap (apt-get install "
                                 "bubblewrap), or turn isolation off to run commands unsandboxed on the host")
    return "none"


@functools.lru_cache(maxsize=1)
def cgroup_support() -> CgroupSupport:
    """This worker's session cgroups (probed once per process)."""
    return detect_cgroups()


def check_cgroups(cfg: SandboxConfig, backend: str) -> CgroupSupport | None:
    """The start-up word on per-session cgroups (logged once per process): where they are made, or why
    they cannot be and what bounds a session instead. Raises SandboxUnavailable with `cgroup_required`."""
    if backend == "none" or cfg.session_memory_mb <= 0:
        return None
    support = cgroup_support()
    if support.kind is None:
        message = (f"os sessions get no cgroup of their own ({support.reason}): each process is bounded "
                   f"(RLIMIT_AS {cfg.memory_mb} MB, {cfg.nproc} processes) but not their sum with the "
                   f"session's tmpfs mounts; run the worker as root or give it a delegated cgroup subtree")
        if cfg.cgroup_required:
            raise SandboxUnavailable(message + " (sandbox.cgroup_required is set)")
        _announce(logging.WARNING, message)
        return None
    _announce(logging.INFO, f"os sessions: a cgroup each ({support.kind}, under "
                            f"{', '.join(map(str, support.parents.values()))}): at most {cfg.session_memory_mb} MB "
                            f"and {cfg.nproc + CGROUP_EXTRA_PIDS} tasks")
    return support


CGROUP_EXTRA_PIDS = 8  # the launcher, bubblewrap and the driver, beyond the session's own `nproc`


@functools.lru_cache(maxsize=4)
def _announce(level: int, message: str) -> None:
    log.log(level, "%s", message)


def check_image(cfg: SandboxConfig, backend: str) -> None:
    """Fail now (at task construction, i.e. worker start) if the sandbox's image is missing."""
    if backend == "bwrap":
        try:
            require_rootfs(cfg.image_dir(), cfg.sandbox_uid(backend))
        except (FileNotFoundError, PermissionError) as e:  # the sandbox cannot run here: say how to fix it
            raise SandboxUnavailable(str(e)) from e
    elif backend == "apptainer" and not cfg.image:
        raise SandboxUnavailable("the apptainer backend needs an image (sandbox.image), "
                                 "e.g. one built from containers/os-sandbox.def")


def apptainer_binary() -> str | None:
    return shutil.which("apptainer") or shutil.which("singularity")


# ------------------------------------------------------------------------------------ process budget

CAP_SYS_RESOURCE = 24


def has_capability(cap: int, status: str = "/proc/self/status") -> bool:
    """Whether this process holds capability number `cap` (effective set)."""
    try:
        for line in Path(status).read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> cap & 1)
    except (OSError, ValueError):
        pass
    return False


def nr_open(path: str = "/proc/sys/fs/nr_open") -> int:
    try:
        return int(Path(path).read_text())
    except (OSError, ValueError):
        return DOCKER_NOFILE  # the kernel's default


def pid_max(path: str = "/proc/sys/kernel/pid_max") -> int:
    try:
        return int(Path(path).read_text())
    except (OSError, ValueError):
        return 32768  # the kernel's default


def file_max(path: str = "/proc/sys/fs/file-max") -> int:
    try:
        return int(Path(path).read_text())
    except (OSError, ValueError):
        return 1 << 20


def host_ptys(base: str = "/proc/sys/kernel/pty") -> int:
    """Ptys the kernel lets all devpts instances but the host's own hold together (max less reserve)."""
    try:
        return int(Path(base, "max").read_text()) - int(Path(base, "reserve").read_text())
    except (OSError, ValueError):
        return 4096 - 1024  # the kernel's defaults


SCM_MAX_FD = 253
"""Files one message may pass: the kernel checks a uid's files in flight before adding a message's, so a uid
may hold this many past its RLIMIT_NOFILE."""
MIN_NOFILE = 1024
"""The fewest open files per process a session is given when `open_files` is 0 (Docker 29's default):
sessions past what the host's file table allows at this many are refused (`session_budget`)."""


def budgets(cfg: SandboxConfig, host_pid_max: int | None = None, host_file_max: int | None = None,
            ptys: int | None = None) -> dict[str, tuple[int, str]]:
    """Sessions at once each host-wide table allows -> (count, why): pids (`pid_fraction` of pid_max over
    `nproc`), open files (`host_share` of fs.file-max over holders x files per holder, at least
    `MIN_NOFILE`, and what a message passes past it per uid), ptys (`host_share` of the ptys over `ptys`;
    bubblewrap's own devpts instance)."""
    pids = host_pid_max or pid_max()
    files = host_file_max or file_max()
    per_process = cfg.open_files or MIN_NOFILE
    out = {"pids": (int(pids * cfg.pid_fraction) // max(cfg.nproc, 1),
                    f"{cfg.pid_fraction:g} of pid_max {pids} over {cfg.nproc} processes"),
           "files": (int(files * cfg.host_share) // (cfg.holders() * per_process
                                                     + (cfg.user_uids + 2) * SCM_MAX_FD),
                     f"{cfg.host_share:g} of fs.file-max {files} over {cfg.processes()} processes and "
                     f"{cfg.user_uids + 2} uids' files in flight x {per_process} files")}
    if cfg.ptys > 0:
        total = ptys or host_ptys()
        out["ptys"] = (int(total * cfg.host_share) // cfg.ptys,
                       f"{cfg.host_share:g} of the host's {total} ptys over {cfg.ptys}")
    return out


def session_budget(cfg: SandboxConfig, host_pid_max: int | None = None, host_file_max: int | None = None,
                   ptys: int | None = None) -> int:
    """How many sessions may live at once on this host: the least any host-wide table allows (`budgets`)."""
    return min(n for n, _ in budgets(cfg, host_pid_max, host_file_max, ptys).values())


def file_share(cfg: SandboxConfig, host_file_max: int | None = None) -> int:
    """Open files one session may hold: `host_share` of fs.file-max over the sessions that may live at once."""
    files = host_file_max or file_max()
    return int(files * cfg.host_share) // max(session_budget(cfg, host_file_max=files), 1)


def check_slots(cfg: SandboxConfig, slots: int, host_pid_max: int | None = None,
                host_file_max: int | None = None, ptys: int | None = None) -> None:
    """Raise ValueError when `slots` sessions could exhaust a host-wide table (pids, open files, ptys)."""
    for name, (budget, why) in budgets(cfg, host_pid_max, host_file_max, ptys).items():
        if slots > budget:
            raise ValueError(f"{slots} sandbox slots exceed this host's {name} budget ({why}): at most "
                             f"{budget} slots, or lower sandbox.nproc / sandbox.open_files / sandbox.ptys")
