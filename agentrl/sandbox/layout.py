"""The file system of a bubblewrap session and the command lines that start a sandbox, as pure functions
where possible (the Apptainer command is built and tested as a command line even where the binary is
absent).

What is here: what stays the image's, read-only (`ETC_PINNED`, `VAR_PINNED`, the children of /usr),
what the session gets as its own (`seed_archive`, `USR_WRITABLE`, `COPIED_BIN`), bubblewrap's mount
arguments (`plan_mounts`), what a grader's view of /usr is made of (`grader_view`, built by the driver's
`enter_view`), and the two command lines (`bwrap_argv`, `apptainer_argv`) with the capabilities they
keep. Not here: the driver that runs inside (`driver.py`) and the session (`agentrl.sandbox.shell`).
"""
from __future__ import annotations

import functools
import io
import os
import tarfile
from pathlib import Path

from agentrl.sandbox.config import SandboxUnavailable
from agentrl.sandbox.rootfs import LEGACY_TOOLS

DOCKER_CAPS = {"CAP_AUDIT_WRITE": 29, "CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_FOWNER": 3, "CAP_FSETID": 4,
               "CAP_KILL": 5, "CAP_MKNOD": 27, "CAP_NET_BIND_SERVICE": 10, "CAP_NET_RAW": 13, "CAP_SETFCAP": 31,
               "CAP_SETGID": 6, "CAP_SETPCAP": 8, "CAP_SETUID": 7, "CAP_SYS_CHROOT": 18}
"""Docker's default capabilities, which root has in AgentBench's containers; here they hold only in the
sandbox's user namespace, over the ids it maps (no CAP_SYS_ADMIN: no mount can be undone)."""
DRIVER_CAPS = {"CAP_SYS_ADMIN": 21, "CAP_SETPCAP": 8, "CAP_SYS_PTRACE": 19}
"""What the sandbox's PID 1, the driver, holds beyond the session's: CAP_SYS_ADMIN (of the sandbox's user
namespace) to give each grader its own read-only view of /usr and the session its own /proc files,
CAP_SETPCAP to cut the bounding set, CAP_SYS_PTRACE to write a trapped sysinfo(2)'s answer into the
calling process (`procview.py`), whatever its uid. The driver takes them out of the bounding, inheritable
and ambient sets before anything else runs, so no session process ever holds one of them (no mount can be
undone, no other process's memory written)."""


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
PROC_MASKED = ("/proc/tty/driver", "/proc/1/fdinfo", "/proc/1/map_files", "/proc/1/task/1/fdinfo", "/proc/sys/fs/quota")
"""Directories inside kept entries: empty and read-only (/proc/sys/fs/quota: the host's disk-quota operation counts)."""
HOST_COUNTERS = ("/proc/sys/fs/aio-nr", "/proc/sys/fs/file-nr", "/proc/sys/fs/inode-nr", "/proc/sys/fs/inode-state",
                 "/proc/sys/fs/dentry-state", "/proc/sys/kernel/pty/nr", "/proc/sys/kernel/random/entropy_avail")
"""Host-wide counts under /proc/sys of kernel objects that any session changes (AIO events, open files, inodes,
dentries, ptys; the entropy pool on kernels before 5.18): read in another session, each is a channel between
them (one session's `io_setup`s or ptys, counted by the next). Each reads empty (/dev/null bound over it;
entropy_avail then reads the kernel's constant 256, `procview.STATIC`); the per-session limits
(`SandboxConfig.nofile`, `ptys`, the seccomp filter) do not need them. The rest of /proc/sys is the host's
configuration (limits, not counts) or the session's own namespaces' (net, ipc, user, ns_last_pid)."""
PROC_KEPT = ("cmdline", "consoles", "cpuinfo", "crypto", "devices", "execdomains", "filesystems", "misc", "mounts",
             "net", "partitions", "self", "sys", "sysvipc", "thread-self", "tty", "version")
"""The entries directly in /proc a session sees as they are: static descriptions of the host (its CPUs, kernel,
devices, file systems), or views of the reader's own namespaces (mounts, net, sysvipc, self). Every other
entry (the process directories aside) is hidden, whatever the kernel adds: /proc/interrupts, softirqs,
diskstats, buddyinfo, zoneinfo, pagetypeinfo, pressure/, schedstat, cgroups (a count of every cgroup on the
host), fs/ (ext4's free blocks per group), irq/, locks, key-users, timer_list, ... each moves with what
other sessions do. The few that `free`, `ps`, `top`, `uptime` and glibc read are the session's own instead
(`PROC_SESSION`)."""
PROC_SESSION = ("meminfo", "stat", "loadavg", "uptime", "vmstat", "swaps")
"""Hidden like the rest by bubblewrap, then given the session's own content by the driver (`procview.py`)."""


def proc_masks(proc: str = "/proc") -> list[str]:
    """bubblewrap's arguments that hide the host-wide entries of /proc (`PROC_KEPT`, `PROC_MASKED`,
    `HOST_COUNTERS`): an empty read-only tmpfs over a directory, /dev/null over a file. Listed from this
    host's /proc, which shows the same kernel's entries as the session's."""
    masks: list[str] = []
    for name in sorted(os.listdir(proc)):
        path = f"/proc/{name}"
        if name.isdigit() or name in PROC_KEPT or os.path.islink(os.path.join(proc, name)):
            continue
        if os.path.isdir(os.path.join(proc, name)):
            masks += ["--size", "4096", "--tmpfs", path, "--remount-ro", path]
        else:
            masks += ["--ro-bind", "/dev/null", path]
    masks += [a for path in PROC_MASKED if os.path.isdir(path)
              for a in ("--size", "4096", "--tmpfs", path, "--remount-ro", path)]
    masks += [a for path in HOST_COUNTERS if os.path.exists(path) for a in ("--ro-bind", "/dev/null", path)]
    return masks


def bwrap_argv(mounts: list[str], command: list[str], hostname: str, disk_mb: int, shm_mb: int,
               in_userns: bool = False, seccomp_fd: int | None = None) -> list[str]:
    """bubblewrap's command line: all namespaces new, the command as PID 1, a bounded tmpfs as root.

    in_userns: bubblewrap runs as root of a user namespace `userns.py` made (many ids mapped,
        no further user namespace allowed): it makes no user namespace of its own, and the sandbox's
        root keeps Docker's default capabilities there. Otherwise bubblewrap makes one (uid 0 only,
        no capabilities) and disables further ones itself.
    seccomp_fd: a file descriptor bubblewrap reads the session's seccomp filter from
        (`agentrl.sandbox.seccomp`), loaded before the command runs.
    """
    masks = proc_masks()
    if in_userns:
        users = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
                 "--assert-userns-disabled", "--cap-drop", "ALL",
                 *(a for c in (*DOCKER_CAPS, *DRIVER_CAPS) for a in ("--cap-add", c))]
    else:
        users = ["--unshare-all", "--unshare-user", "--disable-userns", "--uid", "0", "--gid", "0",
                 "--cap-drop", "ALL", *(a for c in DRIVER_CAPS for a in ("--cap-add", c))]
    if seccomp_fd is not None:
        users += ["--seccomp", str(seccomp_fd)]
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
