"""Sandboxes for tasks that run untrusted code: one isolated system per session, with its own root.

What is here:
  * `select_backend`: Apptainer when it is installed, bubblewrap otherwise, and a clear
    `SandboxUnavailable` when neither is there and isolation was asked for ("none" runs on the host
    and is only for trusted debugging);
  * `bwrap_argv`, `plan_mounts`, `seed_archive`, `apptainer_argv`: command lines and the session's
    file system, as pure functions where possible (the Apptainer command is built and tested as a
    command line even where the binary is absent);
  * `Shell`: one session. Its first process is a small driver (`sandbox_driver.py`, run by the
    image's own python3) that starts each command as its own bash process, waits for it, and answers
    the worker on a channel nothing inside can write to; the shell's state (working directory,
    variables, functions) carries over between commands through a state file, background jobs keep
    running. `run` is the agent's shell; `run_independent` runs init and check scripts in /root with
    a fixed environment, stdout only, in a mount namespace of their own whose /usr is the image's,
    read-only (graders; under bubblewrap), and can stop every other process of the sandbox while it
    runs (graders the policy cannot touch);
  * `check_cgroups`: a cgroup per session (`agentrl.envs.cgroups`) where the worker may make one.

Isolation with bubblewrap: new user, PID, network (loopback only), IPC, UTS and mount namespaces. The
root is a tmpfs of `disk_mb` (everything a session writes lives there, bounded); the image's system
directories (`/usr/*`, `/var/lib`, `/var/cache`) are bound read-only from the image built by `python -m
jobs.make_rootfs` (`agentrl.envs.rootfs`); writable copies of its `/etc`, `/var/log`, ... are unpacked
into the tmpfs at start, and (`writable_bin`) of `/usr/bin` and `/usr/sbin`, copied from the image's
pristine tools under `/usr/lib/agentrl` (`GRADER_TOOLS`), which graders run instead. Nothing of the
host's file system is visible. Files of `/etc` that decide which code a trusted interpreter runs (the
dynamic loader's configuration, python's site configuration, `alternatives`) stay read-only. `/dev/shm`
is a tmpfs of its own (`shm_mb`); `/dev` is read-only. Resource limits (processes, memory, file size,
open files, CPU time) are set by the driver for the whole sandbox; if one cannot be set the session does
not start. RLIMIT_NPROC counts the processes of the sandbox's own user namespace, so a fork bomb
exhausts its own session; the kernel never applies it to the host's root, so a root worker's sandboxes
run as unprivileged host uids (`uid_base`..., or `host_uid` with one id).

User ids: a root worker maps `uid_count` ids (host uids from `uid_base`) into each bubblewrap sandbox
through `sandbox_userns.py`, which also bars further user namespaces and keeps one process budget for
all of them; root there has Docker's default capabilities (`DOCKER_CAPS`), nothing more in its bounding
set. A worker that is not root gets bubblewrap's own namespace: uid 0 only, without capabilities
(`chown` to another user fails). Apptainer's `--fakeroot` maps a range. Not here: task logic
(`agentrl.envs.tasks.os_task`).
"""
from __future__ import annotations

import base64
import functools
import io
import json
import logging
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from agentrl.envs.cgroups import CgroupSupport, SessionCgroup
from agentrl.envs.cgroups import detect as detect_cgroups
from agentrl.envs.rootfs import LEGACY_TOOLS, default_rootfs_dir, require_rootfs

log = logging.getLogger(__name__)

BACKENDS = ("auto", "apptainer", "bwrap", "none")
DRIVER_SOURCE = Path(__file__).with_name("sandbox_driver.py")
USERNS_LAUNCHER = Path(__file__).with_name("sandbox_userns.py")
DOCKER_NOFILE = 1 << 20
DOCKER_CAPS = {"CAP_AUDIT_WRITE": 29, "CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_FOWNER": 3, "CAP_FSETID": 4,
               "CAP_KILL": 5, "CAP_MKNOD": 27, "CAP_NET_BIND_SERVICE": 10, "CAP_NET_RAW": 13, "CAP_SETFCAP": 31,
               "CAP_SETGID": 6, "CAP_SETPCAP": 8, "CAP_SETUID": 7, "CAP_SYS_CHROOT": 18}
"""Docker's default capabilities, which root has in AgentBench's containers; here they hold only in the
sandbox's user namespace, over the ids it maps (no CAP_SYS_ADMIN: no mount can be undone)."""
DRIVER_CAPS = {"CAP_SYS_ADMIN": 21, "CAP_SETPCAP": 8}
"""What the sandbox's PID 1, the driver, holds beyond the session's: CAP_SYS_ADMIN (of the sandbox's user
namespace) to give each grader its own read-only view of /usr, CAP_SETPCAP to cut the bounding set. The
driver takes both out of the bounding, inheritable and ambient sets before anything else runs, so no
session process ever holds CAP_SYS_ADMIN (no mount can be undone)."""
# Reads the driver's source (length-prefixed) from stdin and runs it: keeps the command line short.
BOOT = ("import os\ndef r(n):\n b=b''\n while len(b)<n:\n  c=os.read(0,n-len(b))\n  if not c: raise SystemExit(1)\n"
        "  b+=c\n return b\nh=b''\nwhile not h.endswith(b'\\n'): h+=r(1)\n"
        "exec(compile(r(int(h)),'agentrl-driver','exec'),{'__name__':'__main__'})\n")


class SandboxUnavailable(RuntimeError):
    """The sandbox that was asked for cannot run on this machine."""


class SandboxError(RuntimeError):
    """A session's sandbox failed (did not start, its limits could not be set, its driver died)."""


@dataclass(frozen=True)
class SandboxConfig:
    """How sessions are isolated and limited.

    backend: auto (apptainer, else bwrap, else an error) | apptainer | bwrap | none (no isolation).
    image: bubblewrap: the root file system directory ("" = `agentrl.envs.rootfs.default_rootfs_dir()`,
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
    cpu_s: int = 3600
    disk_mb: int = 512
    """Size of the session's writable root (a tmpfs: host memory, allocated as it is used)."""
    writable_bin: bool = True
    """bubblewrap: the session gets its own copies of /usr/bin and /usr/sbin, as AgentBench's container
    (whose root may `chmod u+s /usr/bin/find` or replace a tool), at ~43 MB of the root tmpfs per session
    for the default image; graders still run the image's pristine tools (`GRADER_TOOLS`). False binds
    them read-only (less memory; samples that change a system tool then fail)."""
    shm_mb: int = 64
    pid_fraction: float = 0.5
    host_uid: int = 65534
    """The uid bubblewrap runs as when the worker is root and `uid_count` is 1 (see the module docstring)."""
    uid_base: int = 2_000_000_000
    """A root worker's bubblewrap sandboxes: inside ids 0..uid_count-1 are these host uids (no user's)."""
    uid_count: int = 65536
    """How many ids a root worker maps into its bubblewrap sandboxes (1: only root, as host_uid)."""
    fakeroot: bool = True
    """Apptainer: `--fakeroot` (root inside, a uid range mapped; needs subuid entries or root)."""
    session_memory_mb: int = 2048
    """A cgroup per session (`agentrl.envs.cgroups`) bounds all it makes, processes and tmpfs pages
    together, to this (pids to `nproc` + 8); 0: none. Where the worker may not make cgroups, sessions run
    with the per-process limits only, said once at start (or fail to start with `cgroup_required`)."""
    cgroup_required: bool = False
    hostname: str = "agentrl-sandbox"
    work_dir: str = ""
    """backend "none" only: where session directories are made ("" = the temp dir)."""

    def many_uids(self, backend: str) -> bool:
        """Whether sessions get a range of user ids (`sandbox_userns.py`): bwrap under a root worker."""
        return backend == "bwrap" and os.geteuid() == 0 and self.uid_count > 1

    def sandbox_uid(self, backend: str) -> int | None:
        """The host uid the sandbox's root runs as (None: this process's own)."""
        if os.geteuid() != 0 or backend == "none":
            return None
        return self.uid_base if self.many_uids(backend) else self.host_uid

    def nofile(self) -> int:
        """The sessions' RLIMIT_NOFILE (see `open_files`)."""
        if self.open_files:
            return self.open_files
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        return max(hard, min(DOCKER_NOFILE, nr_open())) if has_capability(CAP_SYS_RESOURCE) else hard

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
    if requested == "apptainer" and not _apptainer_binary():
        raise SandboxUnavailable("Apptainer was asked for but neither `apptainer` nor `singularity` is on PATH")
    if requested == "bwrap" and not shutil.which("bwrap"):
        raise SandboxUnavailable("bubblewrap was asked for but `bwrap` is not on PATH "
                                 "(Debian/Ubuntu: apt-get install bubblewrap)")
    if requested != "auto":
        return requested
    if _apptainer_binary():
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


def _apptainer_binary() -> str | None:
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


def session_budget(cfg: SandboxConfig, host_pid_max: int | None = None) -> int:
    """How many sessions may live at once on this host: `pid_fraction` of pid_max over `nproc` each."""
    return int((host_pid_max or pid_max()) * cfg.pid_fraction) // max(cfg.nproc, 1)


def check_slots(cfg: SandboxConfig, slots: int, host_pid_max: int | None = None) -> None:
    """Raise ValueError when `slots` sessions of `nproc` processes each could exhaust the host's PIDs."""
    limit = host_pid_max or pid_max()
    budget = session_budget(cfg, limit)
    if slots > budget:
        raise ValueError(f"{slots} sandbox slots x {cfg.nproc} processes each = {slots * cfg.nproc} exceeds "
                         f"{cfg.pid_fraction:g} of this host's pid_max ({limit}): at most {budget} slots, "
                         f"or lower sandbox.nproc")


# ------------------------------------------------------------------------------------ the environment

BASE_ENV: dict[str, str] = {
    "HOME": "/root", "USER": "root", "LOGNAME": "root", "SHELL": "/bin/bash", "TERM": "xterm",
    "LANG": "C.UTF-8", "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
}
CHECK_ENV: dict[str, str] = {
    **BASE_ENV,
    # The image's read-only directories first: nothing the agent puts in /usr/local/bin shadows them.
    "PATH": "/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/sbin:/usr/local/bin",
    # No code from /root (python's cwd entry, user site-packages) runs inside a grader's python3.
    "PYTHONSAFEPATH": "1", "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1",
}
TRUSTED_PYTHON = ["/usr/bin/python3", "-I", "-S"]
"""The image's interpreter, isolated (no PYTHON* variables, no cwd or user site on sys.path) and without
`site` (no .pth file or sitecustomize runs, wherever the agent could write one). Under bubblewrap the
session's /usr/bin is its own copy; a grader's /usr is a read-only view of the image instead
(`sandbox_driver.enter_view`), so this path and its start-up files (pyvenv.cfg, ._pth) are the image's."""
# `python3 -c CODE ARGS...` without `site`: `site` is what defines exit()/quit(), which AgentBench's check
# scripts call; the prelude puts them back and runs CODE with sys.argv as `python3 -c` would set it.
PYTHON_PRELUDE = ("import builtins, sys\nbuiltins.exit = builtins.quit = sys.exit\ncode = sys.argv.pop(1)\n"
                  "exec(compile(code, '<string>', 'exec'), {'__name__': '__main__', '__builtins__': builtins})\n")


def python_argv(code: str, params: list[str]) -> list[str]:
    """A python script as a grader runs it: `TRUSTED_PYTHON` with the prelude; sys.argv[1:] == params."""
    return [*TRUSTED_PYTHON, "-c", PYTHON_PRELUDE, code, *params]


# ------------------------------------------------------------------------------------ root file system

# /etc entries that decide what code a trusted program runs: read-only from the image.
ETC_PINNED = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ld.so.preload", "alternatives")
VAR_PINNED = ("lib", "cache")  # read-only (dpkg's database, caches: large, and no task writes there)
USR_WRITABLE = ("local",)  # /usr/local is the session's (with /usr/local/lib read-only: python's site dirs)
COPIED_BIN = ("bin", "sbin")
"""With `writable_bin`: the session's own copies, which the driver mounts over the image's at start."""
FRESH = ("home", "tmp", "run", "boot", "media", "mnt", "opt", "srv", "root")


def _pinned_etc(image: Path) -> list[str]:
    names = [n for n in ETC_PINNED if (image / "etc" / n).exists() or (image / "etc" / n).is_symlink()]
    names += sorted(n for n in os.listdir(image / "etc") if n.startswith("python3"))
    return names


def top_links(image: str | Path) -> dict[str, str]:
    """The image's top-level symlinks that stay symlinks in a session (/bin -> usr/bin, /sbin -> usr/sbin):
    those into usr/lib* are bound as directories instead (`plan_mounts`)."""
    image = Path(image)
    return {f"/{n}": os.readlink(image / n) for n in sorted(os.listdir(image))
            if (image / n).is_symlink() and not os.readlink(image / n).startswith("usr/lib")}


def plan_mounts(image: str | Path, disk_mb: int = 512) -> list[str]:
    """bubblewrap's mount arguments for a session over `image` (after the root tmpfs is made).

    /usr and /etc are tmpfs mounts of their own (`disk_mb` each), so that neither can be renamed and
    rebuilt by the session (a mount point cannot be moved from inside): in them, read-only, the
    children of /usr (except /usr/local; with `writable_bin` the driver mounts the session's copies of
    /usr/bin and /usr/sbin over the image's), /usr/local/lib and the pinned /etc entries. Also
    read-only: /var/lib, /var/cache, and the image's top-level links into usr/lib* (/lib, /lib64: where
    the dynamic loader is found), bound as directories. The other top-level links stay links
    (`top_links`; the driver restores them before a grader runs). An image built before the copies went
    over the image's own tools holds hard links of them in `LEGACY_TOOLS`: an empty, read-only
    directory here (else `du -sh /usr` would count them beside the session's copies). Everything else
    the session sees comes from `seed_archive`, unpacked into the writable root.
    """
    image = Path(image)
    size = ["--size", str(disk_mb << 20)]
    args: list[str] = []
    for name in sorted(os.listdir(image)):
        src = image / name
        if src.is_symlink():
            target = os.readlink(src)
            if target.startswith("usr/lib"):
                args += ["--ro-bind", str(image / target), f"/{name}"]
            else:
                args += ["--symlink", target, f"/{name}"]
        elif name == "usr":
            args += ["--perms", "0755", *size, "--tmpfs", "/usr"]  # bwrap would make it 0700
            for child in sorted(os.listdir(src)):
                if (src / child).is_symlink():
                    args += ["--symlink", os.readlink(src / child), f"/usr/{child}"]
                elif child not in USR_WRITABLE:
                    args += ["--ro-bind", str(src / child), f"/usr/{child}"]
            if (src / "local" / "lib").is_dir():
                args += ["--ro-bind", str(src / "local" / "lib"), "/usr/local/lib"]
            if (image / LEGACY_TOOLS).is_dir() and not (image / LEGACY_TOOLS).is_symlink():
                args += ["--perms", "0755", "--size", "4096", "--tmpfs", f"/{LEGACY_TOOLS}",
                         "--remount-ro", f"/{LEGACY_TOOLS}"]
        elif name == "var":
            args += [a for v in VAR_PINNED if (src / v).is_dir() for a in ("--ro-bind", str(src / v), f"/var/{v}")]
        elif name == "etc":
            args += ["--perms", "0755", *size, "--tmpfs", "/etc"]
            args += [a for n in _pinned_etc(image) for a in ("--ro-bind", str(src / n), f"/etc/{n}")]
    return args


def grader_view(image: str | Path) -> dict[str, object]:
    """What a grader's /usr is made of (the driver's `enter_view`): the image's, read-only, never the session's.

    ro: the children of /usr that `plan_mounts` binds read-only from the image (the session's own are
    these mounts, which it cannot change; /usr/bin and /usr/sbin are the image's beneath the session's
    copies); links: /usr's symlinks; local: /usr/local stays the session's, and local_lib lists the
    image's (empty) directories under /usr/local/lib, made afresh when the session moved the image's aside.
    """
    src = Path(image) / "usr"
    names = sorted(os.listdir(src))
    lib = src / "local" / "lib"
    if lib.is_dir() and any(not d.is_dir() or d.is_symlink() for d in lib.rglob("*")):
        raise SandboxUnavailable(f"{lib} holds files: a grader's view of /usr/local/lib has the image's "
                                 f"directories only (rebuild the image with `python -m jobs.make_rootfs`)")
    local_lib = ["", *sorted(str(d.relative_to(lib)) for d in lib.rglob("*"))] if lib.is_dir() else [""]
    return {"ro": [n for n in names if not (src / n).is_symlink() and n not in USR_WRITABLE],
            "links": {n: os.readlink(src / n) for n in names if (src / n).is_symlink()},
            "local": "local" in names, "local_lib": local_lib}


@functools.lru_cache(maxsize=4)
def seed_archive(image: str) -> bytes:
    """A tar of what each session gets as its own writable copy: /etc (less the pinned entries), /var
    (less /var/lib and /var/cache), /usr/local (less lib), /root and empty /home, /tmp, /run, ...

    Made once per image in memory (about 2 MB for the default image) and unpacked by the driver.
    """
    root = Path(image)
    buf = io.BytesIO()
    pinned = {f"etc/{n}" for n in _pinned_etc(root)} | {f"var/{v}" for v in VAR_PINNED} | {"usr/local/lib"}

    def skip(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if info.name in pinned or any(info.name.startswith(p + "/") for p in pinned):
            return None
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    with tarfile.open(fileobj=buf, mode="w") as tar:
        for top in ("etc", "var", "usr/local", *FRESH):
            src = root / top
            if top in FRESH and top != "root" or not src.exists():
                info = tarfile.TarInfo(top)
                info.type, info.mode = tarfile.DIRTYPE, 0o1777 if top == "tmp" else 0o755
                tar.addfile(info)
                continue
            tar.add(str(src), arcname=top, recursive=True, filter=skip)
        if (root / "var").is_dir():
            info = tarfile.TarInfo("var/tmp")
            info.type, info.mode = tarfile.DIRTYPE, 0o1777
            tar.addfile(info)
    return buf.getvalue()


# /proc entries a container's root reads but the sandbox's cannot (the host's root-only /proc/tty/driver,
# the non-dumpable driver's own fd tables): empty and read-only, so that `find /` exits 0 as it does in
# AgentBench's container (its check scripts run `find / ...` and test the exit status).
PROC_MASKED = ("/proc/tty/driver", "/proc/1/fdinfo", "/proc/1/map_files", "/proc/1/task/1/fdinfo")


def bwrap_argv(mounts: list[str], command: list[str], hostname: str, disk_mb: int, shm_mb: int,
               in_userns: bool = False) -> list[str]:
    """bubblewrap's command line: all namespaces new, the command as PID 1, a bounded tmpfs as root.

    in_userns: bubblewrap runs as root of a user namespace `sandbox_userns.py` made (many ids mapped,
        no further user namespace allowed): it makes no user namespace of its own, and the sandbox's
        root keeps Docker's default capabilities there. Otherwise bubblewrap makes one (uid 0 only,
        no capabilities) and disables further ones itself.
    """
    masks = [a for path in PROC_MASKED for a in ("--size", "4096", "--tmpfs", path, "--remount-ro", path)]
    if in_userns:
        users = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
                 "--assert-userns-disabled", "--cap-drop", "ALL",
                 *(a for c in (*DOCKER_CAPS, *DRIVER_CAPS) for a in ("--cap-add", c))]
    else:
        users = ["--unshare-all", "--unshare-user", "--disable-userns", "--uid", "0", "--gid", "0",
                 "--cap-drop", "ALL", *(a for c in DRIVER_CAPS for a in ("--cap-add", c))]
    return ["bwrap", *users, "--die-with-parent", "--new-session", "--as-pid-1", "--hostname", hostname,
            "--size", str(disk_mb << 20), "--tmpfs", "/", *mounts, "--proc", "/proc", *masks,
            "--dev", "/dev", "--size", str(shm_mb << 20), "--tmpfs", "/dev/shm",
            "--remount-ro", "/dev", "--clearenv", "--chdir", "/", "--", *command]


def apptainer_argv(image: str, binds: dict[str, str], env: dict[str, str], command: list[str], hostname: str,
                   fakeroot: bool = True, binary: str = "apptainer") -> list[str]:
    """Apptainer's command line: everything contained, no network, a writable tmpfs over the image
    (Apptainer's `sessiondir max size` bounds it). The driver starts every command in /root itself.

    Args:
        binds: host directory -> path inside; the `os` sessions bind nothing of the host (empty).
    """
    argv = [binary, "exec", "--containall", "--no-init", "--net", "--network", "none", "--writable-tmpfs",
            "--hostname", hostname, "--pwd", "/", "--cleanenv"]
    if fakeroot:
        argv.append("--fakeroot")
    for host, inside in binds.items():
        argv += ["--bind", f"{host}:{inside}"]
    for k, v in env.items():
        argv += ["--env", f"{k}={v}"]
    return argv + [image, *command]


# ------------------------------------------------------------------------------------------- the shell

@dataclass
class CommandResult:
    """What one command left: its output, exit status (None when it timed out), and how it ended."""

    output: str
    exit_code: int | None
    timed_out: bool = False
    truncated: bool = False


class Shell:
    """One session's sandbox. Not thread-safe: one command at a time (the worker serializes a session).

    Raises SandboxError when the sandbox does not start (a limit that cannot be set included) or its
    driver dies; `close()` kills every process of the sandbox and is idempotent.
    """

    def __init__(self, cfg: SandboxConfig | None = None) -> None:
        self.cfg = cfg or SandboxConfig()
        self.backend = select_backend(self.cfg.backend, self.cfg.isolation)
        check_image(self.cfg, self.backend)
        self.uid = self.cfg.sandbox_uid(self.backend)
        self.closed = False
        self.cgroup: SessionCgroup | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._buf = b""
        self._dir: Path | None = None
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def argv(self) -> list[str]:
        """The command line that starts this session's sandbox."""
        command = [*TRUSTED_PYTHON, "-c", BOOT]
        if self.backend == "bwrap":
            image = str(self.cfg.image_dir().absolute())
            many = self.cfg.many_uids(self.backend)
            argv = bwrap_argv(plan_mounts(image, self.cfg.disk_mb), command, self.cfg.hostname,
                              self.cfg.disk_mb, self.cfg.shm_mb, in_userns=many)
            if many:
                launch = {"base": self.cfg.uid_base, "count": self.cfg.uid_count, "nproc": self.cfg.nproc,
                          "nofile": self.cfg.nofile()}
                argv[0] = shutil.which("bwrap") or "/usr/bin/bwrap"
                return [sys.executable, "-I", "-S", str(USERNS_LAUNCHER), json.dumps(launch), "--", *argv]
            return argv
        if self.backend == "apptainer":
            return apptainer_argv(self.cfg.image, {}, {}, command, self.cfg.hostname, self.cfg.fakeroot,
                                  _apptainer_binary() or "apptainer")
        return ["python3", "-I", "-S", "-c", BOOT]

    def _driver_config(self) -> tuple[dict[str, object], bytes]:
        c = self.cfg
        limits = {"nproc": c.nproc, "as": c.memory_mb << 20, "fsize": c.file_size_mb << 20,
                  "nofile": c.nofile(), "cpu": c.cpu_s}
        cfg: dict[str, object] = {"env": BASE_ENV, "check_env": CHECK_ENV, "max_output": c.max_output_bytes,
                                  "limits": limits, "home": "/root"}
        if self.backend == "bwrap":  # the bounding set the driver keeps for the session's root
            cfg["caps"] = sorted(DOCKER_CAPS.values()) if c.many_uids(self.backend) else []
            cfg["admin"] = DRIVER_CAPS["CAP_SYS_ADMIN"]
        seed = b""
        if self.backend == "bwrap":
            seed = seed_archive(str(self.cfg.image_dir().absolute()))
            image = self.cfg.image_dir().absolute()
            cfg["links"] = top_links(image)
            if c.writable_bin:
                cfg["copies"] = [f"/usr/{d}" for d in COPIED_BIN if (image / "usr" / d).is_dir()]
                cfg["tools_room"] = c.disk_mb << 20
            cfg["view"] = grader_view(image)
        elif self.backend == "none":  # unsandboxed: keep HOME and the state inside the session directory
            self._dir = Path(tempfile.mkdtemp(prefix="agentrl-sbx-", dir=c.work_dir or None))
            home = str(self._dir)
            cfg.update(home=home, state=f"{home}/.agentrl-state", limits={},
                       env={**BASE_ENV, "HOME": home}, check_env={**CHECK_ENV, "HOME": home})
        cfg["seed_bytes"] = len(seed)
        return cfg, seed

    def _start(self) -> None:
        support = check_cgroups(self.cfg, self.backend)
        if support is not None:
            try:
                self.cgroup = SessionCgroup(support, "agentrl-session", self.cfg.session_memory_mb << 20,
                                            self.cfg.nproc + CGROUP_EXTRA_PIDS)
            except OSError as e:
                if self.cfg.cgroup_required:
                    raise SandboxError(f"could not make the session's cgroup: {e}") from e
                log.warning("os session without a cgroup of its own: %s", e)
        uid = self.uid if self.uid is not None and not self.cfg.many_uids(self.backend) else None
        cgroup = self.cgroup

        def enter() -> None:  # in the child, before exec: the whole sandbox starts inside its cgroup
            if cgroup is not None:
                cgroup.join_self()
            if uid is not None:  # the launcher maps the ids itself (many_uids); here: one unprivileged uid
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)

        self._stderr = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(self.argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._stderr, start_new_session=True, cwd="/",
                                      env={"PATH": BASE_ENV["PATH"], "LANG": "C.UTF-8"},
                                      preexec_fn=enter if cgroup is not None or uid is not None else None)
        cfg, seed = self._driver_config()
        source = DRIVER_SOURCE.read_bytes()
        header = json.dumps(cfg).encode()
        try:
            self._write(b"%d\n" % len(source) + source + b"%d\n" % len(header) + header + seed)
            answer = self._answer(time.monotonic() + max(30.0, self.cfg.command_timeout_s))
        except SandboxError as e:
            message = f"the {self.backend} sandbox did not start: {e}; {self._stderr_tail()}"
            log.error("%s", message)
            raise SandboxError(message) from e
        if "error" in answer:
            log.error("os sandbox refused to start: %s", answer["error"])
            raise SandboxError(f"the {self.backend} sandbox did not start: {answer['error']}")

    def _stderr_tail(self) -> str:
        try:
            self._stderr.seek(0)
            return self._stderr.read()[-500:].decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""

    def _write(self, data: bytes) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None:
            raise SandboxError("the sandbox is not running")
        try:
            proc.stdin.write(data)
            proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise SandboxError(f"the sandbox's driver is gone ({type(e).__name__})") from e

    def _answer(self, deadline: float) -> dict[str, object]:
        """The driver's next answer line, or SandboxError when it died or passed `deadline`."""
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        fd = proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SandboxError("the sandbox's driver did not answer in time")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise SandboxError("the sandbox's driver exited")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        answer: dict[str, object] = json.loads(line)
        return answer

    def _request(self, request: dict[str, object], timeout: float) -> CommandResult:
        if self.closed:
            raise RuntimeError("the sandbox is closed")
        self._write(json.dumps({**request, "timeout": timeout}).encode() + b"\n")
        try:
            answer = self._answer(time.monotonic() + timeout + 15.0)  # the driver enforces `timeout`
        except SandboxError:
            log.error("os sandbox failed: %s", self._stderr_tail())
            self.close()
            raise
        if "error" in answer:
            raise SandboxError(str(answer["error"]))
        output = base64.b64decode(str(answer["output"])).decode("utf-8", errors="replace")
        code = answer["exit"]
        return CommandResult(output, None if code is None else int(str(code)), bool(answer["timed_out"]),
                             bool(answer["truncated"]))

    # ---------------------------------------------------------------------------------- commands
    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        """Run `command` in the session's shell (stdout and stderr together; state carries over)."""
        command = command.replace("\0", "")  # cannot travel in an environment variable or argv (neither in a tty)
        return self._request({"op": "run", "cmd": command}, self.cfg.command_timeout_s if timeout is None else timeout)

    def run_independent(self, argv: list[str], timeout: float | None = None, stderr: bool = False,
                        freeze: bool = False, view: bool = True) -> CommandResult:
        """Run a program outside the shell's state: cwd /root, the fixed check environment, stdout only
        (unless `stderr`); with `freeze`, every other process of the sandbox is stopped meanwhile; with
        `view` (bubblewrap), in its own mount namespace whose /usr is the image's, read-only (graders);
        without, in the session's own (a sample's init script, which may write its /usr/bin)."""
        argv = [a.replace("\0", "") for a in argv]
        return self._request({"op": "exec", "argv": argv, "stderr": stderr, "freeze": freeze, "view": view},
                             self.cfg.command_timeout_s if timeout is None else timeout)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # bwrap's --die-with-parent takes the PID namespace with it
            except (ProcessLookupError, PermissionError):
                pass
            for stream in (proc.stdin, proc.stdout):
                try:
                    if stream:
                        stream.close()
                except OSError:
                    pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
        stderr = getattr(self, "_stderr", None)
        if stderr is not None:
            stderr.close()
        cgroup, self.cgroup = getattr(self, "cgroup", None), None
        if cgroup is not None:
            try:
                cgroup.remove()
            except OSError as e:
                log.warning("could not remove the session's cgroup %s: %s", cgroup.name, e)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def __del__(self) -> None:  # a forgotten session must not leave a sandbox running
        try:
            self.close()
        except Exception:
            pass
