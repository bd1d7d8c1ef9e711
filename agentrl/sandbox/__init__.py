"""The os task's runtime: one isolated system per session, with its own root, for tasks that run untrusted
code. Used by the `os` task (`agentrl.tasks.os_task`) and by the checks that attack it.

  * `shell`: `Shell`, one session (its driver, `run` for the agent's commands, `run_independent` for
    graders), and the environments commands and graders get (`BASE_ENV`, `CHECK_ENV`, `python_argv`);
  * `config`: `SandboxConfig`, the errors, `select_backend` (Apptainer when it is installed, bubblewrap
    otherwise, a clear `SandboxUnavailable` when neither is there and isolation was asked for; "none"
    runs on the host and is only for trusted debugging), the start-up checks (`check_image`,
    `check_cgroups`) and the host's process budget (`check_slots`);
  * `layout`: `bwrap_argv`, `plan_mounts`, `seed_archive`, `grader_view`, `apptainer_argv`: command
    lines and the session's file system, as pure functions where possible (the Apptainer command is
    built and tested as a command line even where the binary is absent);
  * `cgroups`: a cgroup per session where the worker may make one (memory, processes, and the kill of
    everything a session left);
  * `seccomp`: the system-call filter bubblewrap sessions run under;
  * `rootfs`: the image's root file system, built by `python -m jobs.make_rootfs`;
  * `driver.py`, `view.py`, `procview.py` (run inside each sandbox, sent as source by `Shell`: the driver,
    the graders' views, the session's own /proc files and sysinfo answers) and `userns.py` (the launcher
    of a root worker's user namespaces): never imported by the worker.

This package re-exports the names it offered when it was one module.
"""
from agentrl.sandbox.config import (
    BACKENDS,
    CAP_SYS_RESOURCE,
    DOCKER_NOFILE,
    SandboxConfig,
    SandboxError,
    SandboxUnavailable,
    budgets,
    cgroup_support,
    check_cgroups,
    check_image,
    check_slots,
    has_capability,
    nr_open,
    pid_max,
    select_backend,
    session_budget,
)
from agentrl.sandbox.layout import DOCKER_CAPS, apptainer_argv, bwrap_argv, plan_mounts, seed_archive
from agentrl.sandbox.shell import (
    BASE_ENV,
    CHECK_ENV,
    PYTHON_PRELUDE,
    TRUSTED_PYTHON,
    CommandResult,
    Shell,
    python_argv,
)

__all__ = ["BACKENDS", "BASE_ENV", "CAP_SYS_RESOURCE", "CHECK_ENV", "DOCKER_CAPS", "DOCKER_NOFILE", "PYTHON_PRELUDE",
           "TRUSTED_PYTHON", "CommandResult", "SandboxConfig", "SandboxError", "SandboxUnavailable", "Shell",
           "apptainer_argv", "budgets", "bwrap_argv", "cgroup_support", "check_cgroups", "check_image", "check_slots",
           "has_capability", "nr_open", "pid_max", "plan_mounts", "python_argv", "seed_archive", "select_backend",
           "session_budget"]
