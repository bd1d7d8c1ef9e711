"""Play hostile-policy episodes against tasks: does any earn reward without the answer, or hurt the worker?

    python -m jobs.attack_check                               # the built-in tasks (BUILTIN)
    python -m jobs.attack_check --tasks db,kg                 # some of them
    PYTHONPATH=. python -m jobs.attack_check mypkg.mytask:MyTask --option split=dev   # a task of your own
    srun -n1 python -m jobs.attack_check --tasks os           # on a node with the os sandbox

Prints one line per attack and task: reward, status, whether the worker stayed healthy, and HELD or
FAILED; then the totals. Exits 0 when every attack held, 1 when one did not, 2 when a task cannot be
built. A task whose system tools are missing here (bubblewrap and the rootfs for os, mariadbd for
db:mariadb: db on a private MariaDB server, started and stopped here) is skipped with the reason.
The attacks and the player are `agentrl.envs.attacks`.
"""
from __future__ import annotations

import argparse
import logging
import sys

from agentrl.envs.attacks import attacks_for, play_attacks
from agentrl.envs.sandbox import SandboxUnavailable
from agentrl.envs.tasks import get_task, parse_task_options
from agentrl.envs.tasks.db.backends import find_mariadbd

BUILTIN = ("os", "db", "db:mariadb", "kg", "lookup", "bfcl", "alfworld", "webshop")
OPTIONAL = {"bfcl": "bfcl_eval", "alfworld": "textworld"}
"""Built-in tasks whose package may be missing here (install.sh installs them): skipped with the reason."""
VARIANTS = {"db:mariadb": ("db", {"backend": "mariadb"})}
"""Built-in tasks played again with other options: db on AgentBench's engine."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("task", nargs="*", help="tasks of your own, as import paths pkg.module:Class")
    ap.add_argument("--tasks", default=None, help=f"built-in tasks, comma-separated (default {','.join(BUILTIN)}"
                    " when no task of your own is given)")
    ap.add_argument("--option", action="append", default=[], help="a constructor option key=value for your task")
    ap.add_argument("--only", default="", help="play only the attacks whose names contain this")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    names = [t for t in (args.tasks or ("" if args.task else ",".join(BUILTIN))).split(",") if t]
    specs = [VARIANTS.get(n, (n, {})) for n in names] + [(t, parse_task_options(args.option)) for t in args.task]
    failed = played = 0
    for spec, options in specs:
        if options.get("backend") == "mariadb" and find_mariadbd() is None:
            print(f"{spec}: skipped on MariaDB, mariadbd is not installed (apt-get install --no-install-recommends "
                  "mariadb-server)")
            continue
        try:
            task = get_task(spec, **options)
        except SandboxUnavailable as e:
            print(f"{spec}: skipped, its sandbox cannot run here: {e}")
            continue
        except (ImportError, AttributeError, KeyError, TypeError, ValueError, FileNotFoundError) as e:
            if isinstance(e, ImportError) and spec in OPTIONAL:
                print(f"{spec}: skipped, {OPTIONAL[spec]} is not installed ({e})")
                continue
            print(f"cannot build task {spec!r}: {type(e).__name__}: {e}", file=sys.stderr)
            return 2
        attacks = [a for a in attacks_for(task.name, task.tools()) if args.only in a.name]
        label = task.name + (f":{options['backend']}" if "backend" in options else "")
        try:
            for r in play_attacks(task, attacks):
                played += 1
                failed += not r.held
                print(f"{r.attack:24} {label:10} {r.index:10} reward {r.reward:.1f}  {r.status:14} "
                      f"worker {'healthy' if r.healthy else 'HURT':8} {'HELD' if r.held else 'FAILED'}"
                      f"{'  ' + r.detail if r.detail and not r.held else ''}", flush=True)
        finally:
            close = getattr(task, "close", None)
            if callable(close):
                close()  # db:mariadb: its private server
    print(f"{played} attacks played, {played - failed} held, {failed} succeeded")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
