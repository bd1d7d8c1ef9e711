"""Write the built-in tasks' own data into `data/<task>/`, deterministically (fixed seeds).

    python -m jobs.make_task_data                 # every task that has a generator
    python -m jobs.make_task_data os db --check   # exit 1 if the files differ from what the generators give
    srun -n1 python -m jobs.make_task_data --data-dir $RUN_DIR/data     # elsewhere than the repository
    # submitit: executor.submit(jobs.make_task_data.main, ["os", "db"])

The generated files are committed; running this again rewrites them byte for byte (the tests check it).
A task adds itself to `GENERATORS` with a function that returns {relative path: file content}.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from agentrl.envs.tasks.shared import data_root


def os_files() -> dict[str, str]:
    from agentrl.envs.tasks.os_task import data as os_data

    return {f"os/{split}.json": json.dumps(os_data.generate(split), indent=1) + "\n" for split in os_data.SPLIT_SIZES}


def db_files() -> dict[str, str]:
    from agentrl.envs.tasks.db import data as db_data

    return {f"db/{split}.jsonl": "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in db_data.generate(split))
            for split in db_data.SPLIT_SIZES}


def kg_files() -> dict[str, str]:
    from agentrl.envs.tasks.kg import data as kg_data

    return {f"kg/{name}": content for name, content in kg_data.generate().items()}


def webshop_files() -> dict[str, str]:
    from agentrl.envs.tasks.webshop import data as webshop_data

    return {f"webshop/{name}": content for name, content in webshop_data.generate().items()}


GENERATORS: dict[str, Callable[[], dict[str, str]]] = {"os": os_files, "db": db_files, "kg": kg_files,
                                                        "webshop": webshop_files}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tasks", nargs="*", help=f"tasks to generate (default all: {', '.join(GENERATORS)})")
    ap.add_argument("--data-dir", type=Path, default=None, help="default: data/ (AGENTRL_DATA_DIR)")
    ap.add_argument("--check", action="store_true", help="compare with the files on disk instead of writing")
    args = ap.parse_args(argv)
    root = args.data_dir or data_root()
    stale = []
    for name in args.tasks or list(GENERATORS):
        if name not in GENERATORS:
            ap.error(f"no generator for task {name!r} (known: {', '.join(GENERATORS)})")
        for rel, content in GENERATORS[name]().items():
            path = root / rel
            if args.check:
                if not path.is_file() or path.read_text(encoding="utf-8") != content:
                    stale.append(str(path))
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content, encoding="utf-8")
            print(f"wrote {path} ({len(content.encode()):,} bytes)")
    if stale:
        print("stale: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
