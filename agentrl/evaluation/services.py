"""The env side of an evaluation: the controller and env workers as local processes (as `jobs.train` starts
them, logs in OUT/logs/), or the tasks in this process (`--inprocess`, for tasks that need no sandbox).

The evaluation's own run dir (runs/<name>-eval, or --out) holds the config the roles read: the envs
section of the evaluated run's config (its task options: data directories, backends), with the tasks and
the protocol of the evaluation, and the expert route off (on only when the target is the scripted expert).
"""
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from agentrl.config import RunConfig, dump_config
from agentrl.tasks import get_task, get_task_class, task_name

# AgentBench-FC's tasks: they take a `protocol` option (faithful: AgentBench-FC's own loop; strict: ours).
AGENTBENCH_TASKS = ("alfworld", "db", "kg", "os", "webshop")


def takes_protocol(spec: str) -> bool:
    import inspect

    try:
        return "protocol" in inspect.signature(get_task_class(spec)).parameters
    except (TypeError, ValueError):
        return False


def task_options(items: list[str]) -> dict[str, dict[str, object]]:
    """`--task-option TASK.KEY=VALUE` flags (each value read as YAML) as `{task: {key: value}}`."""
    out: dict[str, dict[str, object]] = {}
    for item in items:
        key, eq, value = item.partition("=")
        task, dot, opt = key.partition(".")
        if not eq or not dot:
            raise ValueError(f"--task-option {item!r}: write TASK.KEY=VALUE")
        out.setdefault(task, {})[opt] = yaml.safe_load(value)
    return out


def eval_config(base: RunConfig, name: str, run_root: str, tasks: Sequence[str], protocol: str,
                task_options: Mapping[str, Mapping[str, Any]] = {}, workers: int | None = None,
                expert: bool = False) -> RunConfig:
    """`base` with the evaluation's tasks, each AgentBench task's `protocol` set, extra `task_options`
    merged over the run's own, and the expert route disabled (enabled when the scripted expert is the target:
    `expert`)."""
    opts: dict[str, dict[str, Any]] = {}
    for t in tasks:
        o = {**base.envs.task_options.get(t, {}), **task_options.get(t, {})}
        if task_name(t) in AGENTBENCH_TASKS and takes_protocol(t) and "protocol" not in task_options.get(t, {}):
            o["protocol"] = protocol
        if o:
            opts[t] = o
    envs = replace(base.envs, tasks=tuple(tasks), task_options=opts, expert_route="enabled" if expert else "disabled",
                   workers=workers or base.envs.workers)
    cfg = replace(base, name=name, run_root=run_root, envs=envs)
    cfg.validate()
    return cfg


def inprocess_client(cfg: RunConfig) -> Any:
    """The configured tasks in this process (`agentrl.serving.inprocess`)."""
    from agentrl.serving.inprocess import InProcessClient

    return InProcessClient({task_name(t): get_task(t, **cfg.envs.task_options.get(t, {})) for t in cfg.envs.tasks})


@contextlib.asynccontextmanager
async def env_client(cfg: RunConfig, run_dir: Path, inprocess: bool, echo: Any = None) -> AsyncIterator[Any]:
    """An env client of the evaluation's tasks; the launched roles are stopped on the way out (Ctrl-C
    included)."""
    if inprocess:
        yield inprocess_client(cfg)
        return
    from agentrl.auth import run_secret
    from agentrl.launch import rendezvous
    from agentrl.launch.local import LocalLauncher, start_services
    from agentrl.serving.client import EnvClient

    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, run_dir / "config.yaml")
    (run_dir / rendezvous.FILENAME).unlink(missing_ok=True)  # no stale address from an earlier run
    launcher = LocalLauncher(run_dir)
    try:
        start_services(launcher, cfg.envs.workers, build_model=False, echo=echo)
        url = rendezvous.wait_for(run_dir, "controller_url", timeout_s=60)
        async with EnvClient(url, secret=run_secret(run_dir), keepalive_s=cfg.controller.keepalive_s) as client:
            yield client
    finally:
        launcher.stop_all()
