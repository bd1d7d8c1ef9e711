"""The db task's SQLite backend: an in-memory database per session (the default).

`SqliteDatabase` holds one sample's tables (`tables.Table`) with a statement deadline (progress handler),
a size cap, its TEMP database in memory and bounded, ATTACH refused (no files of the host), and an
authorizer and SQLite's defensive mode that keep every statement to the session's own connection
(`authorize`, `defensive`).

What differs from MySQL (and so between the gold pass rates of the two backends): SQLite compares TEXT
columns as text (`WHERE Goal < 17`), is case-sensitive in `=`, takes "double quotes" as identifiers and
knows no backslash escapes; MySQL converts, folds case, reads "..." as a string. The `affinity="auto"`
option gives SQLite columns whose values are all plain numbers NUMERIC affinity, which fixes most
numeric comparisons while keeping the hash the same for values written back in canonical form.
"""
from __future__ import annotations

import ctypes
import logging
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

from agentrl.tasks.api import time_left
from agentrl.tasks.db.backends.tables import (
    MIN_STATEMENT_S,
    NO_TIME_LEFT,
    Table,
    combine_hashes,
    result_text,
    rows_hash,
    truncate,
)

log = logging.getLogger(__name__)

MAX_VALUE_BYTES = 1 << 20
"""SQLite: the longest string or blob a statement may make (SQLITE_LIMIT_LENGTH). AgentBench's values are
short; a 16 MB `zeroblob` per row once cost the worker 86 MB per row it converted."""
TEMP_BYTES = 64 << 20
"""SQLite: the most a session's TEMP database may hold (kept in memory, `temp_store = MEMORY`: a TEMP table
once wrote 1,175 MB to the host's disk in 11 s, where the main database stops at `max_bytes`)."""


def _is_number(text: str) -> bool:
    """A plain number that SQLite's NUMERIC affinity stores and prints back unchanged."""
    if not re.fullmatch(r"-?(0|[1-9]\d{0,14})(\.\d*[1-9])?", text):
        return False
    return "." not in text or repr(float(text)) == text


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
        except MemoryError:  # SQLite's heap limit in a session process (agentrl.serving.isolation)
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
