"""Per-session databases for the `db` task: SQLite (embedded, the default) and MariaDB/MySQL.

Both build a sample's tables the way AgentBench's dbbench does (every column TEXT, every value inserted
as its string), answer a statement with the observation AgentBench gives (`str()` of the list of row
tuples, or the error, cut at 800 characters), and compute AgentBench's table-state hash that grades
INSERT/UPDATE/DELETE samples: per row the first 5 hex digits of MD5(CONCAT_WS(',', columns...)), the
row hashes sorted and joined with ',' (cut at 1024 bytes, MySQL's default group_concat_max_len), and
the MD5 of that; tables joined with '_' in sorted order; an empty table hashes to "None".

`SqliteDatabase` is an in-memory database per session with a statement deadline (progress handler),
a size cap, and ATTACH refused (no files of the host). `MariaDBDatabase` is a database per session on a
server, with a user of its own that can see only that database when the server lets us create users.
`MariaDBServer` starts a private mariadbd on a Unix socket under a temp dir (no TCP), as a worker does
when it is given no server address; it is configured like AgentBench-FC's database container where
that matters: AgentBench-FC runs `docker.io/library/mysql:8` with no sql_mode option
(`src/server/tasks/dbbench/environment.py` of its repository; its older `Interaction.py` ran the
`mysql` image the same way), so sessions get MySQL 8's default sql_mode (strict), utf8mb4 and
group_concat_max_len 1024. MariaDB's default collation (utf8mb4_general_ci) differs from MySQL 8's
(utf8mb4_0900_ai_ci) only in rare accent and padding cases.

Per-session users: a session's database is reachable only by a user of its own. When the server's
account may not create users, the session fails (`SharedAccountRefused`): sharing one account would let
one session's SQL reach another's database. `allow_shared_account=True` is the explicit, logged opt-in.

What differs between the two engines (and so between the gold pass rates): SQLite compares TEXT
columns as text (`WHERE Goal < 17`), is case-sensitive in `=`, takes "double quotes" as identifiers and
knows no backslash escapes; MySQL converts, folds case, reads "..." as a string. The `affinity="auto"`
option gives SQLite columns whose values are all plain numbers NUMERIC affinity, which fixes most
numeric comparisons while keeping the hash the same for values written back in canonical form.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import re
import secrets
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

RESULT_LIMIT = 800  # AgentBench cuts a result string here and appends "[TRUNCATED]"
MAX_ROWS = 10_000  # rows fetched for one observation (the text is cut at 800 characters anyway)
GROUP_CONCAT_MAX = 1024
# MySQL 8's default sql_mode: AgentBench-FC's mysql:8 container sets none (environment.py, see above)
KILL_GRACE_S = 2.0  # past a statement's deadline, our watchdog KILLs it (the server's own limit comes first)
MYSQL8_SQL_MODE = ("ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,"
                   "ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION")


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


def tables_of(entry: dict[str, Any]) -> list[Table]:
    """The tables of one AgentBench dbbench entry (`table` is one object or a list)."""
    raw = entry["table"] if isinstance(entry["table"], list) else [entry["table"]]
    tables = []
    for t in raw:
        cols = tuple(str(c["name"]) for c in t["table_info"]["columns"])
        rows = tuple(tuple(str(v) for v in row) for row in t["table_info"]["rows"])
        tables.append(Table(str(t["table_name"]), cols, rows))
    return tables


def truncate(text: str) -> str:
    return text[:RESULT_LIMIT] + "[TRUNCATED]" if len(text) > RESULT_LIMIT else text


def combine_hashes(hashes: list[str]) -> str:
    return "_".join(sorted(hashes))


def rows_hash(rows: list[tuple[Any, ...]]) -> str:
    """AgentBench's hash of one table from its rows, computed here instead of by MySQL (None skipped)."""
    if not rows:
        return "None"  # MD5(GROUP_CONCAT(<no rows>)) is NULL
    row_hashes = sorted(hashlib.md5(",".join(str(v) for v in row if v is not None).encode()).hexdigest()[:5]
                        for row in rows)
    joined = ",".join(row_hashes).encode()[:GROUP_CONCAT_MAX]
    return hashlib.md5(joined).hexdigest()


def _is_number(text: str) -> bool:
    """A plain number that SQLite's NUMERIC affinity stores and prints back unchanged."""
    if not re.fullmatch(r"-?(0|[1-9]\d{0,14})(\.\d*[1-9])?", text):
        return False
    return "." not in text or repr(float(text)) == text


# ----------------------------------------------------------------------------------------------- SQLite

class SqliteDatabase:
    """An in-memory SQLite database holding one sample's tables.

    Args:
        tables: the sample's tables.
        timeout_s: longest time one statement may run.
        affinity: "text" (every column TEXT, AgentBench's schema) or "auto" (NUMERIC for columns whose
            values are all plain numbers).
        sqlite_file: start from a copy of this database file instead (AgentBench's `user_sqlite` samples).
        max_bytes: the database cannot grow past this.
    """

    kind = "sqlite"

    def __init__(self, tables: list[Table], timeout_s: float = 10.0, affinity: str = "text",
                 sqlite_file: str | Path | None = None, max_bytes: int = 256 << 20) -> None:
        if affinity not in ("text", "auto"):
            raise ValueError(f"unknown affinity {affinity!r} (text | auto)")
        self.timeout_s = timeout_s
        self.conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        self.conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 16 << 20)
        self._deadline = float("inf")
        if sqlite_file is not None:
            src = sqlite3.connect(f"file:{sqlite_file}?mode=ro", uri=True)
            src.backup(self.conn)
            src.close()
        else:
            for t in tables:
                self._create(t, affinity)
        page = self.conn.execute("PRAGMA page_size").fetchone()[0]
        self.conn.execute(f"PRAGMA max_page_count = {max(1, max_bytes // page)}")
        self.conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        defensive(self.conn)
        self.conn.set_authorizer(self._authorize)
        self.conn.set_progress_handler(self._progress, 10_000)

    def _create(self, t: Table, affinity: str) -> None:
        types = []
        for i in range(len(t.columns)):
            numeric = affinity == "auto" and t.rows and all(_is_number(r[i]) for r in t.rows if i < len(r))
            types.append("NUMERIC" if numeric else "TEXT")
        cols = ", ".join(f"{_quote(c)} {ty}" for c, ty in zip(t.columns, types))
        self.conn.execute(f"CREATE TABLE {_quote(t.name)} ({cols})")
        marks = ", ".join("?" * len(t.columns))
        self.conn.executemany(f"INSERT INTO {_quote(t.name)} VALUES ({marks})", t.rows)

    @staticmethod
    def _authorize(action: int, arg1: str | None, arg2: str | None, db: str | None, trigger: str | None) -> int:
        return authorize(action, arg1, arg2)

    def _progress(self) -> int:
        return 1 if time.monotonic() > self._deadline else 0

    def execute(self, sql: str) -> str:
        """The observation for one statement: `str(rows)` or the error."""
        self._deadline = time.monotonic() + self.timeout_s
        try:
            cur = self.conn.execute(sql)
            rows = cur.fetchmany(MAX_ROWS) if cur.description else []
            text = str(rows)
        except sqlite3.OperationalError as e:
            text = f"Error: the statement ran past {self.timeout_s:g} s" if str(e) == "interrupted" else f"Error: {e}"
        except (sqlite3.Error, ValueError, OverflowError) as e:
            text = f"Error: {e}"
        finally:
            self._deadline = float("inf")
            if self.conn.in_transaction:  # a statement that opened a transaction: keep autocommit semantics
                try:
                    self.conn.execute("COMMIT")
                except sqlite3.Error:
                    pass
        return truncate(text)

    def table_hash(self, tables: list[Table]) -> str:
        hashes = []
        for t in tables:
            cols = ", ".join(f"CAST({_quote(c)} AS TEXT)" for c in t.columns)
            try:
                rows = self.conn.execute(f"SELECT {cols} FROM {_quote(t.name)}").fetchall()
            except sqlite3.Error as e:
                return f"Error: {e}"
            hashes.append(rows_hash(rows))
        return combine_hashes(hashes)

    def close(self) -> None:
        self.conn.close()


CACHE_KIB = 8 << 10  # the page cache of one session's connection (SQLite's default is 2 MiB)
READ_PRAGMAS = frozenset({
    "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo", "foreign_key_list",
    "foreign_key_check", "collation_list", "database_list", "function_list", "module_list", "pragma_list",
    "integrity_check", "quick_check", "encoding", "user_version", "schema_version", "application_id",
    "compile_options", "page_count", "page_size", "max_page_count", "freelist_count", "data_version",
    "foreign_keys", "case_sensitive_like", "recursive_triggers", "defer_foreign_keys", "cache_size"})
"""PRAGMAs a session may run: schema introspection and read-outs. Anything else is refused, since several
act on the whole process (hard_heap_limit, soft_heap_limit, temp_store_directory, shrink_memory: one
session's `PRAGMA hard_heap_limit = 1` once failed every later db session of its worker) or on the
database's integrity (writable_schema, journal_mode)."""
ARGUMENT_PRAGMAS = frozenset({
    "foreign_keys", "case_sensitive_like", "recursive_triggers", "defer_foreign_keys", "user_version",
    "application_id", "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
    "foreign_key_list", "foreign_key_check", "integrity_check", "quick_check"})
"""The PRAGMAs of those that may take a value: a setting of the session's own connection or database, or
the table or index an introspection PRAGMA reads."""
DENIED_FUNCTIONS = frozenset({"fts3_tokenizer", "load_extension"})
"""SQL functions no session may call: `fts3_tokenizer` reads and installs raw C pointers (one call leaked
an address, its two-argument form then crashed the worker), `load_extension` loads native code."""


def authorize(action: int, arg1: str | None, arg2: str | None) -> int:
    """SQLite's authorizer for a session's statements: no other database file, no process-wide PRAGMA,
    no function that touches native memory or code, no virtual table (each module is C code of its own)."""
    if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH, sqlite3.SQLITE_CREATE_VTABLE,
                  sqlite3.SQLITE_DROP_VTABLE):
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_PRAGMA:
        name = (arg1 or "").lower()
        if name not in READ_PRAGMAS or (arg2 is not None and name not in ARGUMENT_PRAGMAS):
            return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


SQLITE_DBCONFIG_DEFENSIVE = 1010
SQLITE_DBCONFIG_ENABLE_FTS3_TOKENIZER = 1004


def defensive(conn: sqlite3.Connection) -> None:
    """SQLite's defensive mode on `conn` (no writable_schema, no journal_mode=OFF, no writes to shadow
    tables) and the two-argument fts3_tokenizer off: `setconfig` from Python 3.12; on 3.11 through the
    C API of the very library the `sqlite3` module loaded (found in this process's mappings, its version
    checked), with the connection's handle read from the object. Where neither works it logs and goes on:
    the authorizer (`authorize`) refuses the same statements."""
    setconfig = getattr(conn, "setconfig", None)
    if setconfig is not None:
        setconfig(SQLITE_DBCONFIG_DEFENSIVE, True)
        setconfig(SQLITE_DBCONFIG_ENABLE_FTS3_TOKENIZER, False)
        return
    lib = _sqlite_library()
    if lib is None:
        return
    handle = ctypes.c_void_p.from_address(id(conn) + ctypes.sizeof(ctypes.c_ssize_t) * 2).value  # after PyObject_HEAD
    out = ctypes.c_int(-1)
    for op, value in ((SQLITE_DBCONFIG_DEFENSIVE, 1), (SQLITE_DBCONFIG_ENABLE_FTS3_TOKENIZER, 0)):
        if lib.sqlite3_db_config(ctypes.c_void_p(handle), op, ctypes.c_int(value), ctypes.byref(out)) != 0 \
                or out.value != value:
            log.warning("sqlite3_db_config(%d, %d) did not hold; the authorizer alone guards", op, value)


_LIBRARY: list[Any] = []


def _sqlite_library() -> Any:
    """The SQLite library the `sqlite3` module uses, by ctypes (None where it cannot be found for sure)."""
    if _LIBRARY:
        return _LIBRARY[0]
    lib = None
    try:
        maps = Path("/proc/self/maps").read_text()
        paths = sorted({line.split()[-1] for line in maps.splitlines() if "libsqlite3" in line and "/" in line})
        for path in paths:
            candidate = ctypes.CDLL(path)
            candidate.sqlite3_libversion.restype = ctypes.c_char_p
            if candidate.sqlite3_libversion().decode() == sqlite3.sqlite_version:
                candidate.sqlite3_db_config.restype = ctypes.c_int
                lib = candidate
                break
    except (OSError, AttributeError, ValueError):
        lib = None
    if lib is None:
        log.warning("SQLite's defensive mode is not set (no sqlite3_db_config found); the authorizer alone guards")
    _LIBRARY.append(lib)
    return lib


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


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
                 own_user: bool = True, allow_shared_account: bool = False, sql_mode: str = MYSQL8_SQL_MODE) -> None:
        self.server = server
        self.sql_mode = sql_mode
        self.timeout_s = timeout_s
        self.name = f"agentrl_{secrets.token_hex(6)}"
        self.user: str | None = None
        self.shared_account = not own_user  # True when this session logs in with the server's own account
        self.admin = server.connect()
        self.conn: Any = None
        try:
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
                    cur.execute(f"GRANT ALL PRIVILEGES ON {_bquote(self.name)}.* TO %s@%s", (user, host))
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
        return conn

    def execute(self, sql: str) -> str:
        """The observation for one statement. The server's own limit (`max_statement_time`, set at login) is
        the session's to change (`SET SESSION max_statement_time = 0`, `SET STATEMENT ... FOR`), so a
        watchdog of ours also ends the statement (`KILL QUERY` from another connection) `KILL_GRACE_S`
        after its deadline, whatever the session set."""
        pymysql = _pymysql()
        watchdog: threading.Timer | None = None
        try:
            if self.conn is None:
                self.conn = self._connect()
            watchdog = threading.Timer(self.timeout_s + KILL_GRACE_S, self._kill, ("QUERY", self.conn.thread_id()))
            watchdog.daemon = True
            watchdog.start()
            with self.conn.cursor() as cur:
                cur.execute(sql)
                rows = list(cur.fetchmany(MAX_ROWS)) if cur.description else []
                while cur.nextset():  # drain any further result sets so the connection stays usable
                    pass
            text = str(rows)
        except pymysql.err.MySQLError as e:
            text = _mysql_error(e)
            if isinstance(e, (pymysql.err.OperationalError, pymysql.err.InterfaceError)) and not _alive(self.conn):
                self.conn = None  # reconnect on the next statement
        finally:
            if watchdog is not None:
                watchdog.cancel()
        return truncate(text)

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
        conn, self.conn = self.conn, None
        admin, self.admin = getattr(self, "admin", None), None
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
        argv = [self.binary, "--no-defaults", f"--datadir={data}", f"--socket={self.socket}", "--skip-networking",
                f"--pid-file={self.dir / 'mysqld.pid'}", f"--log-error={self.dir / 'error.log'}", *as_root,
                "--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci",
                f"--group-concat-max-len={GROUP_CONCAT_MAX}", f"--sql-mode={MYSQL8_SQL_MODE}", "--skip-log-bin",
                "--innodb-buffer-pool-size=64M", "--innodb-flush-log-at-trx-commit=0", "--max-connections=2000"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
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
        shutil.rmtree(self.dir, ignore_errors=True)
