"""Build the `os` task's sandbox root file system (a Debian bookworm image made by debootstrap), cached.

    python -m jobs.make_rootfs                          # into ~/.cache/agentrl/rootfs/os-bookworm
    python -m jobs.make_rootfs --out /shared/rootfs/os-bookworm --mirror http://deb.debian.org/debian
    srun -n1 python -m jobs.make_rootfs --out $SCRATCH/rootfs/os-bookworm     # once per cluster file system
    # submitit: executor.submit(jobs.make_rootfs.main, ["--out", "/shared/rootfs/os-bookworm"])

Needs root and debootstrap (`apt-get install debootstrap`). The mirror defaults to the one apt on this
machine already uses. An image already at `--out` is kept (use `--force` to rebuild); it must be
readable by every user when the worker runs as root (its sandboxes run as an unprivileged uid). The
env worker binds its system directories read-only into each bubblewrap sandbox, under a bounded
writable root; on clusters with Apptainer, build the image from `containers/os-sandbox.def` instead.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from agentrl.sandbox.rootfs import apt_mirror, build_rootfs, default_rootfs_dir


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="where the image goes (default: the cache dir)")
    ap.add_argument("--mirror", default=None, help="Debian mirror URI (default: apt's own)")
    ap.add_argument("--force", action="store_true", help="rebuild even if a finished image is there")
    args = ap.parse_args(argv)
    out = args.out or default_rootfs_dir()
    mirror = args.mirror or apt_mirror()
    path, seconds = build_rootfs(out, mirror, force=args.force)
    print(f"rootfs {path}: " + (f"built in {seconds:.0f} s from {mirror}" if seconds else "already built"), flush=True)
    return path


if __name__ == "__main__":
    main()
