"""Play hostile-policy episodes against tasks: does any earn reward without the answer, or hurt the worker?

    python -m jobs.attack_check                               # the built-in tasks (BUILTIN), the network
                                                              # floods (http) and the agent loop (rollout)
    python -m jobs.attack_check --tasks db,kg                 # some of them
    python -m jobs.attack_check --tasks http --only half      # one flood (--flood-seconds, --connections)
    python -m jobs.attack_check --tasks rollout --model DIR   # hostile texts through your model's chat format
    python -m jobs.attack_check --tasks rollout --preset smollm2-135m               # the model as a run has it
    python -m jobs.attack_check --tasks rollout --model models/SmolLM2-135M-Instruct model.chat_template=chatml-tools
    PYTHONPATH=. python -m jobs.attack_check mypkg.mytask:MyTask --option split=dev   # a task of your own
    srun -n1 python -m jobs.attack_check --tasks os           # on a node with the os sandbox

Prints one line per attack and task: reward, status, whether the worker stayed healthy, and HELD or
FAILED; then the totals. Exits 0 when every attack held, 1 when one did not, 2 when a task cannot be
built. A task whose system tools are missing here (bubblewrap and the rootfs for os, mariadbd for
db:mariadb: db on private MariaDB servers, one per session) is skipped with the reason.
The attacks and the player are `agentrl.checks.attacks`. `http` is not a task: it starts a
controller and an env worker process (serving `lookup`, in a temporary run dir, with a 2 s head deadline)
and floods both from other processes, without the run's secret, while the run's own client plays episodes
through them (`agentrl.checks.attacks.flood`). `rollout` plays hostile texts (the policy's own calls,
env texts that echo it) through the agent loop in the chat formats of the tiny model and the stand-ins of
three families, or of the run's model as configured: `--preset` and `section.field=value` overrides, as
jobs.train and jobs.eval take them (`model.path`, which `--model DIR` sets, `model.chat_template`,
`model.tool_parser`, ...; the built-in tasks get the config's `envs.task_options`) (`agentrl.checks.hostile`).
"""
from __future__ import annotations

import argparse
import logging
import sys

from agentrl.checks.attacks import AttackResult, attacks_for, play_attacks
from agentrl.config import ConfigError, RunConfig, load_config
from agentrl.sandbox import SandboxUnavailable
from agentrl.tasks import get_task, parse_task_options
from agentrl.tasks.db.backends import find_mariadbd

BUILTIN = ("os", "db", "db:mariadb", "kg", "lookup", "bfcl", "alfworld", "webshop", "http", "rollout")
OPTIONAL = {"bfcl": "bfcl_eval", "alfworld": "textworld"}
"""Built-in tasks whose package may be missing here (install.sh installs them): skipped with the reason."""
NOT_TASKS = ("http", "rollout")
VARIANTS = {"db:mariadb": ("db", {"backend": "mariadb"})}
"""Built-in tasks played again with other options: db on AgentBench's engine."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("task", nargs="*", help="tasks of your own, as import paths pkg.module:Class, and config "
                    "overrides section.field=value (e.g. model.chat_template=chatml-tools)")
    ap.add_argument("--preset", default=None, help="a preset name or YAML: the model (rollout) and task options "
                    "a run would use")
    ap.add_argument("--tasks", default=None, help=f"built-in tasks, comma-separated (default {','.join(BUILTIN)}"
                    " when no task of your own is given)")
    ap.add_argument("--option", action="append", default=[], help="a constructor option key=value for your task")
    ap.add_argument("--only", default="", help="play only the attacks whose names contain this")
    ap.add_argument("--flood-seconds", type=float, default=5.0, help="how long each http flood lasts")
    ap.add_argument("--connections", type=int, default=1100, help="connections of each http flood, per server")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every attack's detail, held or not")
    ap.add_argument("--model", default=None, help="rollout: a Hugging Face model directory (default: the tiny "
                    "model's format and the stand-in families)")
    args = ap.parse_intermixed_args(argv)  # overrides may come before or after the options
    logging.basicConfig(level=logging.ERROR)
    overrides = [a for a in args.task if "=" in a] + ([f"model.path={args.model}"] if args.model else [])
    own = [a for a in args.task if "=" not in a]
    try:
        cfg = load_config(args.preset, overrides, trains=False) if args.preset or overrides else None
    except (ConfigError, ValueError, OSError) as e:
        print(f"attack_check: {e}", file=sys.stderr)
        return 2
    configured = cfg.envs.task_options if cfg is not None else {}
    names = [t for t in (args.tasks or ("" if own else ",".join(BUILTIN))).split(",") if t]
    specs = [(spec, {**configured.get(spec, {}), **options})
             for spec, options in (VARIANTS.get(n, (n, {})) for n in names if n not in NOT_TASKS)]
    specs += [(t, parse_task_options(args.option)) for t in own]
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
                failed += not _report(r, label, args.verbose)
        finally:
            close = getattr(task, "close", None)
            if callable(close):
                close()  # db:mariadb: its private server
    if "http" in names:
        for r in _play_floods(args.only, args.flood_seconds, args.connections):
            played += 1
            failed += not _report(r, "http", args.verbose)
    if "rollout" in names:
        try:
            played_rollout = _play_rollout(args.only, cfg)
        except (ValueError, OSError) as e:  # a model or template that cannot run: said, as jobs.check_model does
            print(f"attack_check: rollout: {e}", file=sys.stderr)
            return 2
        for r in played_rollout:
            played += 1
            failed += not _report(r, r.task, args.verbose)
    print(f"{played} attacks played, {played - failed} held, {failed} succeeded")
    return 1 if failed else 0


FLOOD_HEAD_TIMEOUT_S = 2.0
"""The servers' head deadline for the floods (10 s by default): short, so that a few seconds of flood show
whether a connection outlives it."""


def _play_floods(only: str, seconds: float, connections: int) -> list[AttackResult]:
    """The network floods against a controller and a worker process started here (module docstring)."""
    import tempfile

    from agentrl.auth import run_secret
    from agentrl.checks.attacks.flood import MODES, play_floods
    from agentrl.config import ControllerConfig, EnvsConfig, RunConfig, dump_config
    from agentrl.launch import rendezvous
    from agentrl.launch.local import LocalLauncher, start_services

    modes = [m for m in MODES if only in f"flood_{m}"]
    if not modes:
        return []
    with tempfile.TemporaryDirectory(prefix="agentrl-floods-") as root:
        cfg = RunConfig(name="floods", run_root=root,
                        controller=ControllerConfig(head_timeout_s=FLOOD_HEAD_TIMEOUT_S),
                        envs=EnvsConfig(tasks=("lookup",), workers=1, expert_route="enabled"))
        cfg.run_dir.mkdir(parents=True)
        dump_config(cfg, cfg.run_dir / "config.yaml")
        launcher = LocalLauncher(cfg.run_dir)
        try:
            start_services(launcher, 1, build_model=False)
            url = rendezvous.wait_for(cfg.run_dir, "controller_url", timeout_s=60)
            return play_floods(url, run_secret(cfg.run_dir), FLOOD_HEAD_TIMEOUT_S, modes, connections, seconds)
        finally:
            launcher.stop_all()


def _play_rollout(only: str, cfg: RunConfig | None) -> list[AttackResult]:
    """The agent-loop attacks in each chat format (module docstring): the configured model's when `cfg` names
    one (its template, parser, stop tokens and template check, as a run loads them), else the built-in ones."""
    import tempfile
    from pathlib import Path

    from agentrl.checks.hostile import ATTACKS, play_rollout_attacks
    from agentrl.rollout.chat import ChatFormat
    from agentrl.rollout.from_config import chat_format

    attacks = tuple(a for a in ATTACKS if only in a.name)
    if not attacks:
        return []
    if cfg is not None and cfg.model.path:
        model = Path(cfg.model.path)
        name = model.name + (f"+{cfg.model.chat_template}" if cfg.model.chat_template else "")
        return play_rollout_attacks(chat_format(cfg, model), name, attacks)
    from agentrl.models import standins, tiny_chat
    from agentrl.models.tiny_policy import build_tokenizer, expert_conversations

    tok = build_tokenizer(["lookup"], expert_conversations("lookup", 50, seed=0), 800)
    stops = tuple(tok.convert_tokens_to_ids(t) for t in (tiny_chat.IM_END, tiny_chat.EOS))
    out = play_rollout_attacks(ChatFormat.of(tok, "hermes", stops), "tiny", attacks)
    with tempfile.TemporaryDirectory(prefix="agentrl-standins-") as root:
        for family in standins.FAMILIES:
            fmt = ChatFormat.load(standins.build(family, Path(root) / family))
            out += play_rollout_attacks(fmt, family, attacks)
    return out


def _report(r: AttackResult, label: str, verbose: bool = False) -> bool:
    """Print one attack's line; True when it held."""
    print(f"{r.attack:24} {label:10} {r.index:10} reward {r.reward:.1f}  {r.status:14} "
          f"worker {'healthy' if r.healthy else 'HURT':8} {'HELD' if r.held else 'FAILED'}"
          f"{'  ' + r.detail if r.detail and (verbose or not r.held) else ''}", flush=True)
    return r.held


if __name__ == "__main__":
    sys.exit(main())
