"""Apptainer command lines for env workers, built with spython (the design's Apptainer client).

An env worker runs inside the image built from containers/agentrl.def:

    apptainer exec --containall --cleanenv --bind RUN_DIR --bind DATA [--bind EXTRA ...] IMAGE python -m ...

* `--containall`: no home, no host /tmp, a private IPC and PID namespace; only the binds are shared.
* The worker keeps the node's network: it must serve the controller, which calls it over HTTP from another
  node. What runs untrusted code is the `os` task's per-session sandbox, which gets `--net --network none`
  (agentrl/sandbox/layout.py's apptainer_argv) from the image the launcher passes in as the task option
  `envs.task_options.os.sandbox.image` (see `sandbox_options`).

spython's client names its binary `singularity` (on Apptainer sites an alias of `apptainer`); we keep its
command head and put the binary actually found on PATH in its place. We do not use spython's bind
builder: it exits the process when a host path does not exist yet, and a login node renders scripts for
run directories that the job will create. Nothing here runs a container: `require_apptainer` is the
clear error for a node that was asked for one and has none.
"""
from __future__ import annotations

import shutil
from typing import Any


class ApptainerMissing(RuntimeError):
    """The config asks for Apptainer, and neither `apptainer` nor `singularity` is on PATH."""


def binary() -> str | None:
    """The Apptainer binary on PATH (`apptainer`, else its `singularity` alias), or None."""
    return shutil.which("apptainer") or shutil.which("singularity")


def require_apptainer(what: str) -> str:
    """The binary's path; ApptainerMissing naming `what` asked for it (a config field) when there is none."""
    found = binary()
    if not found:
        raise ApptainerMissing(
            f"{what} asks for Apptainer, but neither `apptainer` nor `singularity` is on PATH of {_host()}. "
            "Load the site's module (e.g. `module load apptainer`), or leave the field empty to run without "
            "containers (docs/slurm.md).")
    return found


def _host() -> str:
    import socket

    return socket.gethostname()


def _head(name: str) -> list[str]:
    """spython's `exec` head with `name` as the binary (spython itself always says `singularity`)."""
    from spython.main import Client

    cmd = list(Client._init_command("exec"))
    cmd[0] = name
    return cmd


def worker_command(image: str, run_dir: str, data_dir: str, argv: list[str], binds: tuple[str, ...] = (),
                   name: str = "apptainer") -> list[str]:
    """`argv` run inside `image` with the run dir, the data dir and `binds` bound at the same paths."""
    cmd = _head(name) + ["--containall", "--cleanenv"]
    for path in (run_dir, data_dir, *binds):
        cmd += ["--bind", path]
    return cmd + [image, *argv]


def sandbox_options(task_options: dict[str, Any], image: str) -> dict[str, Any]:
    """The `os` task's options with its per-session sandbox on Apptainer and `image` (the launcher's to pass).

    The task's own default image is empty, so without this every session would fail to start."""
    os_opts = dict(task_options.get("os", {}))
    sandbox = dict(os_opts.get("sandbox", {}))
    sandbox.setdefault("backend", "apptainer")
    sandbox["image"] = image
    os_opts["sandbox"] = sandbox
    return {**task_options, "os": os_opts}
