"""Write the built-in tasks' own data into `data/<task>/`, deterministically (fixed seeds).

    python -m jobs.make_task_data                 # every task that has a generator
    python -m jobs.make_task_data os db --check   # exit 1 if the files differ from what the generators give
    srun -n1 python -m jobs.make_task_data --data-dir $RUN_DIR/data     # elsewhere than the repository
    # submitit: executor.submit(jobs.make_task_data.main, ["os", "db"])

The generated files are committed; running this again rewrites them byte for byte (the tests check it).
A task adds itself to `agentrl.tasks.task_data.GENERATORS` with a function that returns {relative path: file content}.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentrl.tasks.shared import data_root
from agentrl.tasks.task_data import GENERATORS, stale_files, write_files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tasks", nargs="*", help=f"tasks to generate (default all: {', '.join(GENERATORS)})")
    ap.add_argument("--data-dir", type=Path, default=None, help="default: data/ (AGENTRL_DATA_DIR)")
    ap.add_argument("--check", action="store_true", help="compare with the files on disk instead of writing")
    args = ap.parse_args(argv)
    root = args.data_dir or data_root()
    unknown = [name for name in args.tasks if name not in GENERATORS]
    if unknown:
        ap.error(f"no generator for task {unknown[0]!r} (known: {', '.join(GENERATORS)})")
    tasks = args.tasks or list(GENERATORS)
    if args.check:
        stale = stale_files(root, tasks)
        if stale:
            print("stale: " + ", ".join(map(str, stale)), file=sys.stderr)
            return 1
        return 0
    for path, size in write_files(root, tasks):
        print(f"wrote {path} ({size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
