"""A private MariaDB server for the db task: what a worker starts when it is given no server address.

`MariaDBServer` runs mariadbd on a Unix socket under a temp dir (no TCP), in a session of its own watched by
the process's reaper (`agentrl.reaper`: the server and its files go when the worker goes, SIGKILL included),
configured like AgentBench-FC's database container where that matters (MySQL 8's default sql_mode, utf8mb4,
group_concat_max_len 1024; `mariadb` says why) and with the temporary-table limits as each session's maximum
(`TEMP_LIMITS`).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from agentrl.envs.tasks.db.backends.mariadb import MYSQL8_SQL_MODE, TEMP_LIMITS, ServerAddress
from agentrl.envs.tasks.db.backends.tables import GROUP_CONCAT_MAX
from agentrl.reaper import process_reaper


def find_mariadbd() -> str | None:
    """The server binary, also where /usr/sbin is not on PATH."""
    for name in ("mariadbd", "mysqld"):
        found = shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/local/sbin/{name}")
                                            if os.access(p, os.X_OK)), None)
        if found:
            return found
    return None


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
        install = shutil.which("mariadb-install-db") or shutil.which("mysql_install_db")
        if install is None:
            raise FileNotFoundError("mariadb-install-db not found (it comes with mariadb-server)")
        as_root = ["--user=root"] if os.geteuid() == 0 else []
        subprocess.run([install, "--no-defaults", f"--datadir={data}", "--auth-root-authentication-method=normal",
                        "--skip-test-db", *as_root], check=True, capture_output=True, timeout=timeout_s)
        (self.dir / "tmp").mkdir(exist_ok=True)
        argv = [self.binary, "--no-defaults", f"--datadir={data}", f"--socket={self.socket}", "--skip-networking",
                f"--tmpdir={self.dir / 'tmp'}",
                f"--pid-file={self.dir / 'mysqld.pid'}", f"--log-error={self.dir / 'error.log'}", *as_root,
                "--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci",
                f"--group-concat-max-len={GROUP_CONCAT_MAX}", f"--sql-mode={MYSQL8_SQL_MODE}", "--skip-log-bin",
                *(f"--{flag}-{name.replace('_', '-')}={value}" for name, value in TEMP_LIMITS.items()
                  for flag in ("loose", "maximum")),
                "--innodb-temp-data-file-path=ibtmp1:12M:autoextend:max:1G",
                "--innodb-buffer-pool-size=64M", "--innodb-flush-log-at-trx-commit=0", "--max-connections=2000"]
        reaper = process_reaper()  # its own session: nothing of ours reaches it, so it dies with this process
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
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
