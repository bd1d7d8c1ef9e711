"""The db task's MariaDB/MySQL backend: a database of its own per session on a server.

`MariaDBDatabase` is a database per session on a server, with a user of its own that can see only that
database when the server lets us create users. The server is the operator's, or a private one the worker
starts (`server.MariaDBServer`). Sessions are configured like AgentBench-FC's database container where that
matters: AgentBench-FC runs `docker.io/library/mysql:8` with no sql_mode option
(`src/server/tasks/dbbench/environment.py` of its repository; its older `Interaction.py` ran the `mysql`
image the same way), so sessions get MySQL 8's default sql_mode (strict), utf8mb4 and
group_concat_max_len 1024. MariaDB's default collation (utf8mb4_general_ci) differs from MySQL 8's
(utf8mb4_0900_ai_ci) only in rare accent and padding cases.

Per-session users: a session's database is reachable only by a user of its own. When the server's
account may not create users, the session fails (`SharedAccountRefused`): sharing one account would let
one session's SQL reach another's database. `allow_shared_account=True` is the explicit, logged opt-in.
"""
from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.tasks.api import BudgetExceeded, time_left
from agentrl.tasks.db.backends.tables import (
    GROUP_CONCAT_MAX,
    MIN_STATEMENT_S,
    NO_TIME_LEFT,
    Table,
    combine_hashes,
    result_text,
    truncate,
)
from agentrl.tasks.options import MYSQL8_SQL_MODE

log = logging.getLogger(__name__)

KILL_GRACE_S = 2.0  # past a statement's deadline, our watchdog KILLs it (the server's own limit comes first)
WATCH_PERIOD_S = 0.5  # how often the watchdog checks the size of a session's database while a statement runs
SERVER_TEMP_BYTES = 256 << 20
"""MariaDB: while the server's temporary files (sort files, spilled temporary tables) pass this, every running
statement of ours is stopped, with an observation. MariaDB 10.11 cannot bound them per session (11.5's
max_tmp_session_space_usage can); one `ORDER BY` over 10^8 generated rows wrote 1.65 GB in 10 s here."""
TEMP_LIMITS = {"tmp_disk_table_size": 64 << 20, "tmp_memory_table_size": 16 << 20, "max_heap_table_size": 16 << 20,
               "max_session_mem_used": 128 << 20}
"""MariaDB: the most one internal temporary table (a GROUP BY's, a recursive CTE's) may take on disk and in
memory, one MEMORY table, and all the memory of one connection (a statement past it fails with error 1290).
A private server of ours makes them each session's maximum (`--maximum-*`:
a `SET SESSION` above it is cut to it); on another server they are set per session and the operator's
`--maximum-*` options hold them."""
SESSION_PRIVILEGES = ("SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, ALTER, INDEX, CREATE VIEW, SHOW VIEW, "
                      "LOCK TABLES, REFERENCES, TRIGGER")
"""What a session's user may do in its own database: everything AgentBench's tasks do, but no temporary
tables (whose space the server cannot tell apart per session), stored routines or events."""


def _bquote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _bquote_fmt(name: str) -> str:
    """A backquoted name inside a query PyMySQL formats with `%` parameters (executemany formats the
    whole query, so a `%` in a name, e.g. AgentBench's "Win %" columns, must be doubled)."""
    return _bquote(name).replace("%", "%%")


class SharedAccountRefused(RuntimeError):
    """No user of its own could be made for a session, and sharing the server's account was not allowed."""



# ---------------------------------------------------------------------------------------------- MariaDB

def _pymysql() -> Any:
    try:
        import pymysql
    except ImportError as e:
        raise ImportError("the db task's MariaDB backend needs PyMySQL: pip install pymysql") from e
    return pymysql


@dataclass(frozen=True)
class ServerAddress:
    """Where a MySQL-compatible server listens, and an account that may create databases (and users)."""

    host: str = "127.0.0.1"
    port: int = 3306
    unix_socket: str = ""
    user: str = "root"
    password: str = ""

    @classmethod
    def parse(cls, address: str, user: str = "root", password: str = "") -> ServerAddress:
        """"host:port", "host" or "unix:/path/to/socket"."""
        if address.startswith("unix:"):
            return cls(unix_socket=address[5:], user=user, password=password)
        host, _, port = address.rpartition(":") if ":" in address else (address, "", "3306")
        if not port.isdigit():
            raise ValueError(f"bad MariaDB address {address!r} (host:port or unix:/path)")
        return cls(host=host or "127.0.0.1", port=int(port), user=user, password=password)

    def connect(self, user: str | None = None, password: str | None = None, database: str | None = None,
                read_timeout: float | None = None) -> Any:
        pymysql = _pymysql()
        kwargs: dict[str, Any] = dict(user=user or self.user, password=self.password if password is None else password,
                                      database=database, autocommit=True, charset="utf8mb4", connect_timeout=10)
        if read_timeout:
            kwargs["read_timeout"] = read_timeout
        if self.unix_socket:
            kwargs["unix_socket"] = self.unix_socket
        else:
            kwargs.update(host=self.host, port=self.port)
        return pymysql.connect(**kwargs)


class MariaDBDatabase:
    """A database of its own on a MySQL-compatible server for one session; dropped by `close()`."""

    kind = "mariadb"

    def __init__(self, server: ServerAddress, tables: list[Table], timeout_s: float = 10.0,
                 own_user: bool = True, allow_shared_account: bool = False, sql_mode: str = MYSQL8_SQL_MODE,
                 quota_bytes: int = 256 << 20, temp_usage: Callable[[], int] | None = None,
                 on_close: Callable[[], None] | None = None) -> None:
        self.on_close = on_close  # called once, after the database is dropped (the server's holder lets go)
        self.server = server
        self.sql_mode = sql_mode
        self.timeout_s = timeout_s
        self.quota_bytes = quota_bytes
        self.temp_usage = temp_usage  # the server's temporary files, where this process can see them
        self._monitor: Any = None  # the server's account, for the watchdog's size checks (one user at a time)
        self.name = f"agentrl_{secrets.token_hex(6)}"
        self.user: str | None = None
        self.shared_account = not own_user  # True when this session logs in with the server's own account
        self.admin: Any = None
        self.conn: Any = None
        try:
            self.admin = server.connect()
            with self.admin.cursor() as cur:
                cur.execute(f"CREATE DATABASE {_bquote(self.name)}")
            user, password = server.user, server.password
            if own_user:
                user, password = self._make_user(allow_shared_account)
            self._login = (user, password)
            self.conn = self._connect()
            with self.conn.cursor() as cur:
                for t in tables:
                    cols = ",".join(f"{_bquote(c)} TEXT" for c in t.columns)
                    cur.execute(f"CREATE TABLE IF NOT EXISTS {_bquote(t.name)} ({cols})")
                    if t.rows:
                        marks = ",".join(["%s"] * len(t.columns))
                        cur.executemany(f"INSERT INTO {_bquote_fmt(t.name)} ({','.join(map(_bquote_fmt, t.columns))}) "
                                        f"VALUES ({marks})", list(t.rows))
        except BaseException:
            self.close()
            raise

    def _make_user(self, allow_shared_account: bool) -> tuple[str, str]:
        user, password = self.name, secrets.token_hex(12)
        try:
            with self.admin.cursor() as cur:
                cur.execute("CREATE USER %s@'%%' IDENTIFIED BY %s", (user, password))
                self.user = user
                cur.execute("CREATE USER %s@'localhost' IDENTIFIED BY %s", (user, password))
                for host in ("%", "localhost"):
                    cur.execute(f"GRANT {SESSION_PRIVILEGES} ON {_bquote(self.name)}.* TO %s@%s", (user, host))
            return user, password
        except Exception as e:  # a given server may not let us: fail, unless sharing was explicitly allowed
            if not allow_shared_account:
                log.error("db: cannot create a MariaDB user for session database %s (%s); the session fails "
                          "(allow a shared account explicitly with the task option mariadb_shared_account)",
                          self.name, e)
                raise SharedAccountRefused(f"cannot create a MariaDB user per session ({e}); sharing the "
                                           f"account {self.server.user!r} is not allowed") from e
            log.warning("db: cannot create a MariaDB user per session (%s); session database %s shares the "
                        "account %s, as the task option mariadb_shared_account allows (no isolation between "
                        "sessions)", e, self.name, self.server.user)
            self.shared_account = True
            return self.server.user, self.server.password

    def _connect(self) -> Any:
        user, password = self._login
        conn = self.server.connect(user, password, self.name, read_timeout=self.timeout_s + 30)
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_mode = %s", (self.sql_mode,))
            cur.execute(f"SET SESSION group_concat_max_len = {GROUP_CONCAT_MAX}")
            try:  # MariaDB's statement time limit (seconds); MySQL has max_execution_time for SELECTs only
                cur.execute(f"SET SESSION max_statement_time = {float(self.timeout_s)}")
            except Exception:
                cur.execute(f"SET SESSION max_execution_time = {int(self.timeout_s * 1000)}")
            for name, value in TEMP_LIMITS.items():  # a server of ours also caps them (`--maximum-*`)
                cur.execute(f"SET SESSION {name} = {value}")
        return conn

    def execute(self, sql: str) -> str:
        """The observation for one statement. The server's own limit (`max_statement_time`, set at login) is
        the session's to change (`SET SESSION max_statement_time = 0`, `SET STATEMENT ... FOR`), so a
        watchdog of ours also ends the statement (`KILL QUERY` from another connection) `KILL_GRACE_S`
        after its deadline, whatever the session set, or earlier when the message's budget ends first.

        The result is streamed (an unbuffered cursor): rows are read and turned into text only until the
        observation's 800 characters are full (`result_text`), the rest is read and dropped unconverted,
        so a statement's result never sits in this process (the client library once read 1.39 GB of one).
        The watchdog also KILLs the statement when the session's database grows past `quota_bytes`; the
        session then ends as the agent's failure (`BudgetExceeded`), which drops the database."""
        pymysql = _pymysql()
        left = time_left()
        if min(self.timeout_s, left) < MIN_STATEMENT_S:
            return NO_TIME_LEFT
        watchdog: _Watchdog | None = None
        try:
            if self.conn is None:
                self.conn = self._connect()
            watchdog = _Watchdog(self, self.conn.thread_id(), min(self.timeout_s + KILL_GRACE_S, left))
            watchdog.start()
            text = self._stream(self.conn.cursor(pymysql.cursors.SSCursor), sql)
        except pymysql.err.MySQLError as e:
            text = _mysql_error(e)
            if isinstance(e, (pymysql.err.OperationalError, pymysql.err.InterfaceError)) and not _alive(self.conn):
                self.conn = None  # reconnect on the next statement
        finally:
            if watchdog is not None:
                watchdog.finish()
        if watchdog is not None and watchdog.reason == "temp":
            text = (f"Error: the server's temporary files passed {SERVER_TEMP_BYTES >> 20} MB while the statement "
                    "ran; it was stopped")
        if watchdog is not None and watchdog.reason == "quota" or self.usage() > self.quota_bytes:
            raise BudgetExceeded(f"the session's database grew past its quota of {self.quota_bytes >> 20} MB")
        return truncate(text)

    def _stream(self, cur: Any, sql: str) -> str:
        """Run `sql` on the unbuffered cursor `cur`; the observation text of its first rows (see `execute`)."""
        broken = False
        try:
            cur.execute(sql)
            text = result_text(iter(cur.fetchone, None)) if cur.description else "[]"
        except UnicodeDecodeError as e:  # e.g. after `SET character_set_results = latin1`: the reader is lost
            text, broken = f"Error: the result is not valid {e.encoding} text ({e.reason} at byte {e.start})", True
        except UnicodeEncodeError as e:  # a lone surrogate ("\ud800" in the call's JSON): nothing was sent
            text = f"Error: the statement is not valid {e.encoding} text ({e.reason} at character {e.start})"
        finally:
            try:
                cur.close()  # reads what is left of the result without converting it, until the statement ends
            except Exception:  # noqa: BLE001 - killed while read: the connection's reader is mid-result
                broken = True
            if broken:  # a new connection for the next statement
                conn, self.conn = self.conn, None
                with contextlib.suppress(Exception):
                    conn.close()
        return text

    def usage(self) -> int:
        """Bytes the session's database takes on the server: its InnoDB files, and its other tables' data and
        indexes (MEMORY, Aria, MyISAM). 0 where the server's account may not read them."""
        try:
            if self._monitor is None:
                self._monitor = self.server.connect()
            with self._monitor.cursor() as cur:
                cur.execute(
                    "SELECT (SELECT COALESCE(SUM(FILE_SIZE), 0) FROM information_schema.INNODB_SYS_TABLESPACES "
                    "WHERE SUBSTRING_INDEX(NAME, '/', 1) = %s) + (SELECT COALESCE(SUM(DATA_LENGTH + INDEX_LENGTH), 0) "
                    "FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND ENGINE <> 'InnoDB')",
                    (self.name, self.name))
                return int(cur.fetchone()[0] or 0)
        except Exception as e:  # noqa: BLE001 - no size, no quota: said once per session
            if self._monitor is not None:
                log.warning("db: cannot read the size of MariaDB database %s (%s); no disk quota", self.name, e)
                with contextlib.suppress(Exception):
                    self._monitor.close()
            self._monitor = None
            self.quota_bytes = 1 << 62
            return 0

    def _kill(self, what: str, thread_id: int) -> None:
        """`KILL QUERY|CONNECTION id` of the session's connection, from a short connection of the server's
        account (the session's user could not be trusted to do it, nor could its connection, which is busy)."""
        try:
            conn = self.server.connect()
            try:
                with conn.cursor() as cur:
                    cur.execute(f"KILL {what} {int(thread_id)}")
            finally:
                conn.close()
        except Exception as e:  # gone already: nothing to end
            log.debug("KILL %s %s: %s", what, thread_id, e)

    def table_hash(self, tables: list[Table]) -> str:
        hashes = []
        for t in tables:
            cols = ",".join(map(_bquote, t.columns))
            query = (f"SELECT MD5(GROUP_CONCAT(rowhash ORDER BY rowhash)) FROM (SELECT SUBSTRING(MD5(CONCAT_WS(',', "
                     f"{cols})), 1, 5) AS rowhash FROM {_bquote(t.name)}) AS sub")
            try:
                if self.conn is None:
                    self.conn = self._connect()
                with self.conn.cursor() as cur:
                    cur.execute(query)
                    value = cur.fetchone()[0]
            except _pymysql().err.MySQLError as e:
                return _mysql_error(e)
            hashes.append(str(value))
        return combine_hashes(hashes)

    def close(self) -> None:
        """Drop the session's database and user; first end every connection of its user (a statement still
        running, e.g. one the session freed of its time limit, holds locks that DROP DATABASE would wait on,
        and would otherwise run on after the session)."""
        try:
            self._drop()
        finally:
            on_close, self.on_close = getattr(self, "on_close", None), None
            if on_close is not None:
                on_close()

    def _drop(self) -> None:
        conn, self.conn = self.conn, None
        admin, self.admin = getattr(self, "admin", None), None
        monitor, self._monitor = getattr(self, "_monitor", None), None
        if monitor is not None:
            with contextlib.suppress(Exception):
                monitor.close()
        ids = set()
        try:
            if conn is not None:
                ids.add(int(conn.thread_id()))
            if admin is not None:  # KILL before closing ours: a thread blocked reading it holds its reader's lock
                with admin.cursor() as cur:
                    if self.user:
                        cur.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE USER = %s", (self.user,))
                        ids |= {int(row[0]) for row in cur.fetchall()}
                    for thread_id in sorted(ids):
                        try:
                            cur.execute(f"KILL CONNECTION {thread_id}")
                        except Exception:  # ended meanwhile
                            pass
        except Exception as e:
            log.warning("could not end the connections of MariaDB database %s: %s", self.name, e)
        try:
            if conn is not None:
                conn.close()
        except Exception:
            pass
        if admin is None:
            return
        try:
            with admin.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS {_bquote(self.name)}")
                if self.user:
                    for host in ("%", "localhost"):
                        cur.execute("DROP USER IF EXISTS %s@%s", (self.user, host))
        except Exception as e:
            log.warning("could not drop MariaDB database %s: %s", self.name, e)
        finally:
            try:
                admin.close()
            except Exception:
                pass


    def __del__(self) -> None:  # a session dropped without close() must not leave its database behind
        try:
            self.close()
        except Exception:
            pass


class _Watchdog(threading.Thread):
    """Ends one statement of a session (`KILL QUERY` from the server's account): at `after_s`, as soon as the
    session's database passes its quota, or while the server's temporary files pass `SERVER_TEMP_BYTES`
    (checked every `WATCH_PERIOD_S`). `reason` says which."""

    def __init__(self, db: MariaDBDatabase, thread_id: int, after_s: float) -> None:
        super().__init__(daemon=True, name="db-watchdog")
        self.db, self.thread_id = db, thread_id
        self.deadline = time.monotonic() + after_s
        self.done = threading.Event()
        self.reason = ""

    def run(self) -> None:
        while not self.done.wait(max(0.0, min(WATCH_PERIOD_S, self.deadline - time.monotonic()))):
            if time.monotonic() >= self.deadline:
                self.reason = "time"
            elif self.db.usage() > self.db.quota_bytes:
                self.reason = "quota"
            elif self.db.temp_usage is not None and self.db.temp_usage() > SERVER_TEMP_BYTES:
                self.reason = "temp"
            else:
                continue
            self.db._kill("QUERY", self.thread_id)
            return

    def finish(self) -> None:
        self.done.set()
        self.join()


def server_temp_usage(address: ServerAddress) -> Callable[[], int] | None:
    """A function giving the bytes the server at `address` holds in temporary files (sort files of a huge
    ORDER BY, spilled temporary tables: created and unlinked, so only its open descriptors show them), or
    None where this process cannot see them (another host, another user's server)."""
    try:
        conn = address.connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT @@pid_file, @@tmpdir, @@hostname")
                pid_file, tmpdir, _ = cur.fetchone()
        finally:
            conn.close()
        pid = int(Path(pid_file).read_text().split()[0])
        os.listdir(f"/proc/{pid}/fd")
    except Exception as e:  # noqa: BLE001 - not ours to see: no bound on its temporary files
        log.info("db: the MariaDB server's temporary files are not visible here (%s); no bound on them", e)
        return None
    dirs = tuple(d.rstrip("/") + "/" for d in str(tmpdir).split(":") if d)

    def usage() -> int:
        total = 0
        try:
            fds = os.scandir(f"/proc/{pid}/fd")
        except OSError:
            return 0
        with fds:
            for fd in fds:
                try:
                    if os.readlink(fd.path).startswith(dirs):
                        total += os.stat(fd.path).st_size
                except OSError:
                    continue
        return total
    return usage


def _mysql_error(e: Exception) -> str:
    args = getattr(e, "args", ())
    if len(args) >= 2 and isinstance(args[0], int):
        return f"Error {args[0]}: {args[1]}"
    return f"Error: {e}"


def _alive(conn: Any) -> bool:
    try:
        conn.ping(reconnect=False)
        return True
    except Exception:
        return False
