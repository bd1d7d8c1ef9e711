"""A private MariaDB server for the db task: what a worker starts when it is given no server address.

`MariaDBServer` runs mariadbd on a Unix socket under a temp dir (no TCP), in a session of its own watched by
the process's reaper (`agentrl.reaper`: the server and its files go when the worker goes, SIGKILL included),
configured like AgentBench-FC's database container where that matters (MySQL 8's default sql_mode, utf8mb4,
group_concat_max_len 1024; `mariadb` says why) and with the per-session limits as each session's maximum
(`TEMP_LIMITS`).

One server per session (the db task's sessions each run in a process of their own, which starts its own
server on first use): whatever one server shows to every account (SHOW GLOBAL STATUS's Com_select and
Sort_rows, user-level locks of GET_LOCK/IS_FREE_LOCK, UUID_SHORT()'s counter, connection ids, the table
cache) is then one session's only; the privilege system cannot hide those. Cost, measured on a 2-core
host (docs/tasks.md): ~0.35 s to start from a data directory made once per worker (`template_dir`: a
sparse copy of 6 MB instead of mariadb-install-db's 5 s and 114 MB), and ~55 MB of memory per live
session with `SMALL` (an 8 MB buffer pool; AgentBench's tables are a few KB).
"""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from agentrl.reaper import process_reaper
from agentrl.tasks.db.backends.mariadb import MYSQL8_SQL_MODE, TEMP_LIMITS, ServerAddress
from agentrl.tasks.db.backends.tables import GROUP_CONCAT_MAX


def find_mariadbd() -> str | None:
    """The server binary, also where /usr/sbin is not on PATH."""
    for name in ("mariadbd", "mysqld"):
        found = shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/local/sbin/{name}")
                                            if os.access(p, os.X_OK)), None)
        if found:
            return found
    return None


SMALL = ("--innodb-buffer-pool-size=8M", "--innodb-buffer-pool-size-max=8M", "--key-buffer-size=1M",
         "--aria-pagecache-buffer-size=8M", "--performance-schema=0", "--thread-cache-size=0",
         "--table-open-cache=200", "--max-connections=32")
"""A server of one session: small caches (a session's tables are small; the limits of `TEMP_LIMITS` bound a
statement's own memory), and connections enough for the session, its watchdog and its size checks."""

_TEMPLATES: dict[str, Path] = {}
_TEMPLATE_LOCK = threading.Lock()


def template_dir(binary: str, timeout_s: float = 120.0) -> Path:
    """A fresh server's data directory, made once per process by mariadb-install-db (its 96 MB redo log made
    sparse): each server copies it (`cp --sparse=always`) instead of installing. Removed at exit."""
    with _TEMPLATE_LOCK:
        if binary in _TEMPLATES and _TEMPLATES[binary].is_dir():
            return _TEMPLATES[binary]
        install = shutil.which("mariadb-install-db") or shutil.which("mysql_install_db")
        if install is None:
            raise FileNotFoundError("mariadb-install-db not found (it comes with mariadb-server)")
        top = Path(tempfile.mkdtemp(prefix="agentrl-mariadb-template-"))
        atexit.register(shutil.rmtree, top, True)
        as_root = ["--user=root"] if os.geteuid() == 0 else []
        subprocess.run([install, "--no-defaults", f"--datadir={top / 'installed'}",
                        "--auth-root-authentication-method=normal", "--skip-test-db", *as_root],
                       check=True, capture_output=True, timeout=timeout_s)
        subprocess.run(["cp", "-a", "--sparse=always", str(top / "installed"), str(top / "data")], check=True)
        shutil.rmtree(top / "installed")
        _TEMPLATES[binary] = top / "data"
        return top / "data"


class MariaDBServer:
    """A private mariadbd on a Unix socket under a temp dir: started by `start()`, removed by `stop()`."""

    def __init__(self, base_dir: str | Path | None = None) -> None:
        self.binary = find_mariadbd()
        if self.binary is None:
            raise FileNotFoundError("no mariadbd/mysqld found (Debian/Ubuntu: apt-get install mariadb-server), "
                                    "or give the db task a server address")
        self.dir = Path(tempfile.mkdtemp(prefix="agentrl-mariadb-", dir=base_dir))
        self.socket = str(self.dir / "mysqld.sock")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> ServerAddress:
        return ServerAddress(unix_socket=self.socket, user="root")

    def start(self, timeout_s: float = 60.0) -> MariaDBServer:
        data = self.dir / "data"
        assert self.binary is not None
        subprocess.run(["cp", "-a", "--sparse=always", str(template_dir(self.binary, timeout_s)), str(data)],
                       check=True, capture_output=True, timeout=timeout_s)
        as_root = ["--user=root"] if os.geteuid() == 0 else []
        (self.dir / "tmp").mkdir(exist_ok=True)
        argv = [self.binary, "--no-defaults", f"--datadir={data}", f"--socket={self.socket}", "--skip-networking",
                f"--tmpdir={self.dir / 'tmp'}",
                f"--pid-file={self.dir / 'mysqld.pid'}", f"--log-error={self.dir / 'error.log'}", *as_root,
                "--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci",
                f"--group-concat-max-len={GROUP_CONCAT_MAX}", f"--sql-mode={MYSQL8_SQL_MODE}", "--skip-log-bin",
                *(f"--{flag}-{name.replace('_', '-')}={value}" for name, value in TEMP_LIMITS.items()
                  for flag in ("loose", "maximum")),
                "--innodb-temp-data-file-path=ibtmp1:12M:autoextend:max:1G",
                "--innodb-flush-log-at-trx-commit=0", *SMALL]
        reaper = process_reaper()  # its own session: nothing of ours reaches it, so it dies with this process
        # Under a db session's process it inherits that process's RLIMIT_AS (`agentrl.serving.isolation`): a bound
        # on the server's memory too, which it fits with a buffer pool that reserves only its size (by default
        # 10.11 reserves 8 TB of address space, or all the limit allows) and few malloc arenas (64 MB each).
        env = dict(os.environ, MALLOC_ARENA_MAX="2")
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True, env=env)
        reaper.watch(self.proc.pid, remove=self.dir)  # and its files
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mariadbd exited ({self.proc.returncode}): {self._log_tail()}")
            try:
                self.address.connect().close()
                return self
            except Exception:
                time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"mariadbd did not answer within {timeout_s:g} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            return (self.dir / "error.log").read_text(errors="replace")[-800:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop the server, wait for it, remove its files. Idempotent."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if proc is not None:
            process_reaper().forget(proc.pid)
        shutil.rmtree(self.dir, ignore_errors=True)


