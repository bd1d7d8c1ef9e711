"""The `os` sandbox's own root file system: a Debian image built with debootstrap, cached on disk.

Why: a sandbox over the host's `/usr`, `/lib` and `/etc` shows the host (its configuration, its tool
versions, its process list paths) and makes results depend on the machine. A dedicated image, bound
read-only as the sandbox's `/`, shows nothing of the host and is the same on every machine that builds
it from the same Debian suite. On clusters the Apptainer image from `containers/os-sandbox.def` plays
this role.

What is here: where the image lives (`default_rootfs_dir`, overridable by the `AGENTRL_ROOTFS_DIR`
environment variable or the task's `sandbox.image` option), the debootstrap command line that builds it
(`debootstrap_argv`), the mirror apt already uses (`apt_mirror`), the build itself (`build_rootfs`,
atomic: built beside, then renamed) and the check a task runs before it starts a sandbox
(`require_rootfs`, whose error names the command that builds the image). The job entry point is
`jobs/make_rootfs.py`.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

NAME = "os-bookworm"
SUITE = "bookworm"
# What AgentBench's os tasks call (its image: Ubuntu + python3, pip, git, vim, curl, wget, zip, unzip,
# tree) beyond debootstrap's minbase (bash, coreutils, findutils, grep, sed, gzip, tar, passwd, ...).
PACKAGES = ("python3", "procps", "psmisc", "gawk", "tree", "zip", "unzip", "file", "bc", "less", "vim-tiny",
            "curl", "wget", "ca-certificates", "iproute2", "cron", "nano")
STAMP = ".agentrl-rootfs"
"""A file at the image's top: written last, so a half-built image is never taken for a whole one."""
LEGACY_TOOLS = "usr/lib/agentrl"
"""Where images built before 2026-12-02 kept hard links of /usr/bin and /usr/sbin for the graders. Sessions
now get their writable copies mounted over the image's own tools, which graders' views uncover, so new
images have no such directory; in an old one a session sees it empty (`sandbox.plan_mounts`), and it is
left in place for code that still wants it."""
DEFAULT_MIRROR = "http://deb.debian.org/debian"


def default_rootfs_dir(name: str = NAME) -> Path:
    """`$AGENTRL_ROOTFS_DIR`, else `~/.cache/agentrl/rootfs/<name>` (XDG_CACHE_HOME respected).

    For root it is `/var/cache/agentrl/rootfs/<name>`: a root worker runs its sandboxes as an
    unprivileged uid (see `agentrl.sandbox`), which cannot enter root's 0700 home directory.
    """
    env = os.environ.get("AGENTRL_ROOTFS_DIR", "").strip()
    if env:
        return Path(env).expanduser()
    if os.geteuid() == 0:
        return Path("/var/cache/agentrl/rootfs") / name
    cache = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(cache) / "agentrl" / "rootfs" / name


def is_rootfs(path: str | Path) -> bool:
    """A finished image: its stamp is there, and so are bash and python3 (the sandbox driver's)."""
    p = Path(path)
    return (p / STAMP).is_file() and (p / "usr/bin/bash").exists() and (p / "usr/bin/python3").exists()


def require_rootfs(path: str | Path, uid: int | None = None) -> Path:
    """`path` if it holds a finished image that `uid` (None: this process) can read, else an error that
    names the command that builds it."""
    p = Path(path).expanduser().absolute()
    if not is_rootfs(p):
        raise FileNotFoundError(
            f"no os sandbox root file system at {p}: build it with `python -m jobs.make_rootfs --out {p}` "
            f"(needs root, debootstrap and the Debian mirror; ~2 minutes, ~215 MB), or point the os task's "
            f"sandbox.image option (or AGENTRL_ROOTFS_DIR) at one")
    if uid is not None and uid != os.geteuid():
        for d in [p, *p.parents]:
            st = d.stat()
            if st.st_uid != uid and not st.st_mode & 0o001:
                raise PermissionError(f"the sandbox's uid {uid} cannot enter {d} (on the way to the root file "
                                      f"system {p}): put the image where every user can read it, e.g. "
                                      f"/var/cache/agentrl/rootfs")
    return p


def apt_mirror(sources_dir: str | Path = "/etc/apt/sources.list.d", sources_list: str | Path = "/etc/apt/sources.list",
               suite: str = SUITE) -> str:
    """The Debian mirror apt on this machine already uses for `suite` (deb822 or one-line sources)."""
    texts: list[str] = []
    d = Path(sources_dir)
    if d.is_dir():
        texts += [f.read_text(errors="replace") for f in sorted(d.glob("*.sources"))]
        one_line = [f.read_text(errors="replace") for f in sorted(d.glob("*.list"))]
    else:
        one_line = []
    if Path(sources_list).is_file():
        one_line.append(Path(sources_list).read_text(errors="replace"))
    for text in texts:  # deb822 stanzas: URIs + Suites
        for stanza in re.split(r"\n\s*\n", text):
            fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, flags=re.M))
            if suite in fields.get("Suites", "").split() and fields.get("Types", "deb").split()[0] == "deb":
                return fields["URIs"].split()[0]
    for text in one_line:
        m = re.search(rf"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+{suite}\s", text, flags=re.M)
        if m:
            return m.group(1)
    return DEFAULT_MIRROR


def debootstrap_argv(target: str | Path, mirror: str, suite: str = SUITE,
                     packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """debootstrap's command line: the minbase variant plus `packages`."""
    return ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite, str(target), mirror]


def build_rootfs(out: str | Path, mirror: str | None = None, force: bool = False) -> tuple[Path, float]:
    """Build the image at `out` (skipped when a finished one is there, unless `force`).

    Built in `<out>.partial` and renamed into place, so an interrupted build leaves no half image at
    `out`. Returns (path, seconds spent; 0.0 when it was already there).
    """
    out = Path(out).expanduser()
    if is_rootfs(out) and not force:
        return out, 0.0
    if shutil.which("debootstrap") is None:
        raise FileNotFoundError("debootstrap is not installed (Debian/Ubuntu: apt-get install debootstrap)")
    if os.geteuid() != 0:
        raise PermissionError("debootstrap needs root (it creates device nodes and chroots into the image)")
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    subprocess.run(debootstrap_argv(partial, mirror or apt_mirror()), check=True)
    _finish(partial)
    if out.exists():
        shutil.rmtree(out)
    partial.rename(out)
    return out, time.monotonic() - started


def _finish(root: Path) -> None:
    """Make the image fit a read-only, unprivileged sandbox; then stamp it."""
    # Nothing of the build machine stays behind in the image.
    for rel in ("etc/hostname", "etc/resolv.conf"):
        p = root / rel
        if p.exists() or p.is_symlink():
            p.unlink()
    (root / "etc/hostname").write_text("agentrl-sandbox\n")
    shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
    (root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
    for d in ("var/lib/apt/lists",):
        for f in (root / d).glob("*"):
            if f.is_file():
                f.unlink()
    # The sandbox runs as an unprivileged host uid: everything must be world-readable (root-only
    # directories such as /root or /var/cache/ldconfig would otherwise trip `find /`), and nothing keeps
    # a setuid bit (no privilege to gain inside, and tools refuse to run half-setuid).
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if os.path.islink(p):
                continue
            mode = st.st_mode & 0o7777 & ~0o6000
            mode |= 0o444 | (0o111 if os.path.isdir(p) or mode & 0o100 else 0)
            os.chmod(p, mode)
    # An empty, read-only /etc/ld.so.preload is bound over the sandbox's writable /etc (see sandbox.py).
    (root / "etc/ld.so.preload").write_text("")
    (root / STAMP).write_text(f"{NAME} suite={SUITE} packages={','.join(PACKAGES)}\n")

