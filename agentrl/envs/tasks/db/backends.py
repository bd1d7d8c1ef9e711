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

import contextlib
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.envs.task import BudgetExceeded, time_left

log = logging.getLogger(__name__)

RESULT_LIMIT = 800  # AgentBench cuts a result string here and appends "[TRUNCATED]"
MAX_ROWS = 10_000  # rows fetched for one observation (the text is cut at 800 characters anyway)
MAX_VALUE_BYTES = 1 << 20
"""SQLite: the longest string or blob a statement may make (SQLITE_LIMIT_LENGTH). AgentBench's values are
short; a 16 MB `zeroblob` per row once cost the worker 86 MB per row it converted."""
MIN_STATEMENT_S = 0.2
"""A statement needs at least this much of its message's budget left to start."""
NO_TIME_LEFT = "Error: this message's time is spent; the statement did not run."
TEMP_BYTES = 64 << 20
"""SQLite: the most a session's TEMP database may hold (kept in memory, `temp_store = MEMORY`: a TEMP table
once wrote 1,175 MB to the host's disk in 11 s, where the main database stops at `max_bytes`)."""
GROUP_CONCAT_MAX = 1024
# MySQL 8's default sql_mode: AgentBench-FC's mysql:8 container sets none (environment.py, see above)
KILL_GRACE_S = 2.0  # past a statement's deadline, our watchdog KILLs it (the server's own limit comes first)
WATCH_PERIOD_S = 0.5  # how often the watchdog checks the size of a session's database while a statement runs
SERVER_TEMP_BYTES = 256 << 20
"""MariaDB: while the server's temporary files (sort files, spilled temporary tables) pass this, every running
statement of ours is stopped, with an observation. MariaDB 10.11 cannot bound them per session (11.5's
max_tmp_session_space_usage can); one `ORDER BY` over 10^8 generated rows wrote 1.65 GB in 10 s here."""
TEMP_LIMITS = {"tmp_disk_table_size": 64 << 20, "tmp_memory_table_size": 16 << 20, "max_heap_table_size": 16 << 20}
"""MariaDB: the most one internal temporary table (a GROUP BY's, a recursive CTE's) may take on disk and in
memory, and one MEMORY table. A private server of ours makes them each session's maximum (`--maximum-*`:
a `SET SESSION` above it is cut to it); on another server they are set per session and the operator's
`--maximum-*` options hold them."""
SESSION_PRIVILEGES = ("SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, ALTER, INDEX, CREATE VIEW, SHOW VIEW, "
                      "LOCK TABLES, REFERENCES, TRIGGER")
"""What a session's user may do in its own database: everything AgentBench's tasks do, but no temporary
tables (whose space the server cannot tell apart per session), stored routines or events."""
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


def result_text(rows: Iterable[tuple[Any, ...]], limit: int = RESULT_LIMIT, max_rows: int = MAX_ROWS) -> str:
    """AgentBench's observation text `str(list(rows))`, built row by row and no further than its first
    `limit` characters need (then cut by `truncate` as before): a statement's rows are streamed, never held,
    and a value's text is made from its first characters only (`_value_repr`)."""
    parts, size = ["["], 1
    for count, row in enumerate(rows):
        if count >= max_rows:
            break
        values = [_value_repr(v, limit + 8) for v in row]
        piece = (", " if count else "") + "(" + ", ".join(values) + ("," if len(values) == 1 else "") + ")"
        parts.append(piece)
        size += len(piece)
        if size > limit:
            return "".join(parts)
    return "".join(parts) + "]"


def _value_repr(value: Any, limit: int) -> str:
    """`repr(value)`, or for a long str or bytes value a prefix of it of at least `limit` characters (the
    same prefix `repr` would start with: the quote Python picks depends on the whole value, so it is picked
    from the whole value and forced on the prefix with a suffix that is then cut off)."""
    if not isinstance(value, (str, bytes)) or len(value) <= limit:
        return repr(value)
    quote_char, dquote_char = ("'", '"') if isinstance(value, str) else (b"'", b'"')
    double = quote_char in value and dquote_char not in value  # repr would quote with "
    head = value[:limit]
    # head + '"' + "'" makes repr pick ' (when the whole does), head + "'" makes it pick " (when the whole does)
    tail = quote_char if double else quote_char + dquote_char
    text = repr(head + tail)
    return text[:-(len(repr(tail)) - (1 if isinstance(value, str) else 2))]


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
        self.conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
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
        self.conn.execute("PRAGMA temp_store = MEMORY")  # never the host's disk; bounded just below
        self.conn.execute(f"PRAGMA temp.max_page_count = {max(1, TEMP_BYTES // page)}")
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
        """The observation for one statement: `str(rows)` (streamed: `result_text`) or the error. It runs at
        most `timeout_s`, and no longer than what is left of the message's budget (`time_left`)."""
        timeout = min(self.timeout_s, time_left())
        if timeout < MIN_STATEMENT_S:
            return NO_TIME_LEFT
        self._deadline = time.monotonic() + timeout
        cur = None
        try:
            cur = self.conn.execute(sql)
            text = result_text(cur) if cur.description else "[]"
        except sqlite3.OperationalError as e:
            text = f"Error: the statement ran past {timeout:g} s" if str(e) == "interrupted" else f"Error: {e}"
        except MemoryError:  # SQLite's heap limit in a session process (agentrl.envs.isolation)
            text = "Error: out of memory"
        except (sqlite3.Error, ValueError, OverflowError) as e:
            text = f"Error: {e}"
        finally:
            if cur is not None:
                cur.close()  # a result read only in part: the statement is reset here
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
                 own_user: bool = True, allow_shared_account: bool = False, sql_mode: str = MYSQL8_SQL_MODE,
                 quota_bytes: int = 256 << 20, temp_usage: Callable[[], int] | None = None) -> None:
        self.server = server
        self.sql_mode = sql_mode
        self.timeout_s = timeout_s
        self.quota_bytes = quota_bytes
        self.temp_usage = temp_usage  # the server's temporary files, where this process can see them
        self._monitor: Any = None  # the server's account, for the watchdog's size checks (one user at a time)
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
