"""The local launcher: every role as a process on this machine, the same entry points Slurm would run.

Each role's output goes to run_dir/logs/<role>.log. `watch` follows those logs, echoes agentrl's own
progress lines, and returns when the roles that define the run's end have exited (or one has failed).
Roles run in sessions of their own (a role is stopped with everything it started), so nothing ends them when
the launching process ends: every launcher's live roles are stopped when this interpreter exits, however it
was unwound (a SIGTERM turned into SystemExit inside an event loop skipped the `finally` that stops them in
`jobs.eval` and left an env worker and its MariaDB server running), and when it is killed outright, by the
process's reaper (`agentrl/reaper.py`).
Standard library only: like the rest of `launch`, it runs without torch or vLLM.
"""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agentrl.launch import rendezvous
from agentrl.reaper import process_reaper


@dataclass
class Role:
    name: str
    proc: subprocess.Popen
    log_path: Path
    offset: int = 0
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    restarts: int = 0


@dataclass(eq=False)  # compared by identity
class LocalLauncher:
    run_dir: Path
    python: str = sys.executable
    roles: dict[str, Role] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._owner = os.getpid()  # a forked child that exits normally must not stop its parent's roles
        _LAUNCHERS.append(self)

    def start(self, name: str, module: str, *args: str, env: dict[str, str] | None = None) -> Role:
        command = [self.python, "-m", module, "--run-dir", str(self.run_dir), *args]
        return self.start_command(name, command, env)

    def start_command(self, name: str, command: list[str], env: dict[str, str] | None = None) -> Role:
        """Start any command as role `name` (e.g. an `mpiexec` MPMD world), its output in logs/<name>.log."""
        logs = self.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"{name}.log"
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        role = Role(name, self._spawn(command, log_path, full_env), log_path, command=command, env=full_env)
        self.roles[name] = role
        return role

    @staticmethod
    def _spawn(command: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen:
        reaper = process_reaper()  # first: a role never runs unwatched
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        reaper.watch(proc.pid)  # its own session: the group id is its pid
        return proc

    def restart(self, name: str) -> Role:
        """Start a role that exited again, with the same command (its log goes on in the same file)."""
        role = self.roles[name]
        _signal_group(role.proc, signal.SIGKILL)  # whatever the dead role left in its group (engine cores, sandboxes)
        process_reaper().forget(role.proc.pid)
        role.proc = self._spawn(role.command, role.log_path, role.env)
        role.restarts += 1
        return role

    def run(self, name: str, module: str, *args: str, timeout_s: float = 600.0,
            echo: Callable[[str, str], None] | None = None) -> None:
        """Start a role and wait for it; RuntimeError with the log's tail if it fails."""
        self.start(name, module, *args)
        failed = self.watch([name], timeout_s, echo)
        if failed:
            raise RuntimeError(self.failure_report(failed))

    def watch(self, names: list[str], timeout_s: float, echo: Callable[[str, str], None] | None = None,
              poll_s: float = 0.5, restartable: tuple[str, ...] = (), max_restarts: int = 0,
              before_restart: Callable[[str], None] | None = None) -> str | None:
        """Wait until every role in `names` exited 0. Returns the name of a role that failed (any
        started role exiting non-zero counts), or raises TimeoutError.

        A role whose name starts with one of `restartable` (e.g. "env_worker-") is started again when it
        exits, at most `max_restarts` times each, and the run goes on (the controller routes around it
        meanwhile); past that it counts as failed. `before_restart(name)` runs first (e.g. to clear the
        dead role's addresses from rendezvous.json)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if echo:
                for role in self.roles.values():
                    self._follow(role, echo)
            for role in self.roles.values():
                rc = role.proc.poll()
                if rc is None or role.name in names and rc == 0:
                    continue
                if role.name.startswith(restartable) and restartable and role.restarts < max_restarts:
                    print(f"[  launcher] {role.name} exited with {rc}; restarting it "
                          f"({role.restarts + 1} of {max_restarts})", file=sys.stderr, flush=True)
                    if before_restart is not None:
                        before_restart(role.name)
                    self.restart(role.name)
                elif rc != 0:
                    return role.name
            if all(self.roles[n].proc.poll() == 0 for n in names):
                return None
            if time.monotonic() > deadline:
                raise TimeoutError(f"roles {names} still running after {timeout_s:.0f}s")
            time.sleep(poll_s)

    def _follow(self, role: Role, echo: Callable[[str, str], None]) -> None:
        with open(role.log_path, "rb") as f:
            f.seek(role.offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1
        role.offset += end
        for line in chunk[:end].decode(errors="replace").splitlines():
            echo(role.name, line)

    def failure_report(self, name: str, lines: int = 40) -> str:
        role = self.roles[name]
        tail = role.log_path.read_text(errors="replace").splitlines()[-lines:]
        return f"role {name} exited with {role.proc.returncode}; last lines of {role.log_path}:\n" + "\n".join(tail)

    def stop_all(self, grace_s: float = 10.0) -> None:
        """SIGTERM every live role (its whole process group), then SIGKILL what is left after `grace_s`."""
        live = [r for r in self.roles.values() if r.proc.poll() is None]
        for r in self.roles.values():  # a crashed role's children (engine cores, sandboxes) live on in its group
            _signal_group(r.proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for r in live:
            try:
                r.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(r.proc, signal.SIGKILL)
                r.proc.wait()
        for r in self.roles.values():
            _signal_group(r.proc, signal.SIGKILL)  # whatever is left in the groups
            process_reaper().forget(r.proc.pid)


_LAUNCHERS: list[LocalLauncher] = []
"""Every launcher made in this process, held until it exits: a launcher whose owner's frame was torn down (the
coroutine collected as it was in `jobs.eval`) must still be found here."""


@atexit.register
def _stop_launched_roles() -> None:
    """Stop what any launcher of this process left running (a no-op after its own `stop_all`)."""
    for launcher in _LAUNCHERS:
        if launcher._owner == os.getpid() and any(r.proc.poll() is None for r in launcher.roles.values()):
            launcher.stop_all(grace_s=5.0)


def start_services(launcher: LocalLauncher, workers: int, build_model: bool,
                   echo: Callable[[str, str], None] | None = None) -> None:
    """Controller (and its address in rendezvous.json), env workers, the model build (waited for)."""
    launcher.start("controller", "jobs.controller")
    rendezvous.wait_for(launcher.run_dir, "controller_url", timeout_s=60)
    for w in range(workers):
        launcher.start(f"env_worker-{w}", "jobs.env_worker", "--worker-id", f"worker-{w}")
    if build_model:
        launcher.run("make_model", "jobs.make_model", timeout_s=600, echo=echo)


PIPELINE = "pipeline"  # the role name of the MPI world (trainer + rollout ranks)
PIPELINE_KEYS = rendezvous.PIPELINE_KEYS  # the keys cleared before the pipeline or its trainer restarts
TRAINER = "trainer"  # file mode's role names: the trainer, and rollout-<r> per rank
ROLLOUT_PREFIX = "rollout-"


def mpiexec() -> str:
    """The `mpiexec` of the mpich wheel beside this interpreter, else the one on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    found = str(here) if here.exists() else shutil.which("mpiexec")
    if not found:
        raise FileNotFoundError("no mpiexec: install the mpich wheel (pip install mpich mpi4py)")
    return found


def mpmd_command(python: str, run_dir: Path, rollout_ranks: int, engine_threads: int,
                 trainer_module: str = "jobs.trainer", rollout_module: str = "jobs.rollout",
                 trainer_ranks: int = 1) -> list[str]:
    """One MPMD world: the trainer's ranks are world ranks 0..T-1 (T = `trainer_ranks`; its hub is rank 0),
    rollout rank r is world rank T + r. Every rank starts under `python -m mpi4py`, so an uncaught exception
    aborts the world instead of leaving it waiting; OMP_NUM_THREADS is explicit for the engine ranks
    (mpiexec would start them with 1, platform.md)."""
    rd = str(run_dir)
    return [mpiexec(), "-n", str(trainer_ranks), python, "-m", "mpi4py", "-m", trainer_module, "--run-dir", rd, ":",
            "-n", str(rollout_ranks), "-env", "OMP_NUM_THREADS", str(engine_threads),
            python, "-m", "mpi4py", "-m", rollout_module, "--run-dir", rd]


def start_pipeline(launcher: LocalLauncher, workers: int, build_model: bool, rollout_ranks: int,
                    engine_threads: int, echo: Callable[[str, str], None] | None = None,
                    channel: str = "mpi", trainer_ranks: int = 1) -> list[str]:
    """A run's roles (either schedule): the services (`start_services`), then the trainer and the rollout ranks.

    channel "mpi": one MPI world under mpiexec (role `pipeline`, its ranks' lines tagged [trainer] (the hub),
    [trainer-k] (the other data-parallel trainer ranks, `trainer_ranks` in all) and [rollout-r]); "files"
    (one trainer rank): no MPI, the trainer and each rollout rank a role of its own (`trainer`, `rollout-<r>`,
    each with its own log), so that one can be restarted without the others.

    Returns:
        The names of the roles started for the pipeline.
    """
    if channel == "files" and trainer_ranks != 1:
        raise ValueError(f"transport.channel=files runs one trainer rank, not {trainer_ranks}")
    start_services(launcher, workers, build_model, echo)
    if channel == "files":
        launcher.start(TRAINER, "jobs.trainer")
        names = [TRAINER]
        for r in range(rollout_ranks):  # vLLM's CPU attention needs more than the one thread a bare env may give
            launcher.start(f"{ROLLOUT_PREFIX}{r}", "jobs.rollout", "--rank", str(r),
                           env={"OMP_NUM_THREADS": str(engine_threads)})
            names.append(f"{ROLLOUT_PREFIX}{r}")
        return names
    launcher.start_command(PIPELINE, mpmd_command(launcher.python, launcher.run_dir, rollout_ranks, engine_threads,
                                                  trainer_ranks=trainer_ranks))
    return [PIPELINE]


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
