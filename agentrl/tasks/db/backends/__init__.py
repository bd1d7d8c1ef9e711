"""Per-session databases for the `db` task: SQLite (embedded, the default) and MariaDB/MySQL.

  * `tables`: a sample's tables (`Table`, `tables_of`) and what both backends answer about them the way
    AgentBench's dbbench does: the observation text of a statement and the table-state hash;
  * `sqlite`: `SqliteDatabase`, an in-memory database per session;
  * `mariadb`: `MariaDBDatabase`, a database and a user of its own per session on a server;
  * `server`: `MariaDBServer`, a private server a worker starts when it is given no address.

This package re-exports the names `agentrl.tasks.db.backends` offered when it was one module.
"""
from agentrl.tasks.db.backends.mariadb import (
    KILL_GRACE_S,
    MYSQL8_SQL_MODE,
    SERVER_TEMP_BYTES,
    SESSION_PRIVILEGES,
    TEMP_LIMITS,
    WATCH_PERIOD_S,
    MariaDBDatabase,
    ServerAddress,
    SharedAccountRefused,
    server_temp_usage,
)
from agentrl.tasks.db.backends.server import MariaDBServer, find_mariadbd
from agentrl.tasks.db.backends.sqlite import (
    ARGUMENT_PRAGMAS,
    CACHE_KIB,
    DENIED_FUNCTIONS,
    MAX_VALUE_BYTES,
    READ_PRAGMAS,
    SQLITE_DBCONFIG_DEFENSIVE,
    SQLITE_DBCONFIG_ENABLE_FTS3_TOKENIZER,
    TEMP_BYTES,
    SqliteDatabase,
    authorize,
    defensive,
)
from agentrl.tasks.db.backends.tables import (
    GROUP_CONCAT_MAX,
    MAX_ROWS,
    MIN_STATEMENT_S,
    NO_TIME_LEFT,
    RESULT_LIMIT,
    Table,
    combine_hashes,
    result_text,
    rows_hash,
    tables_of,
    truncate,
)

__all__ = ["ARGUMENT_PRAGMAS", "CACHE_KIB", "DENIED_FUNCTIONS", "GROUP_CONCAT_MAX", "KILL_GRACE_S", "MAX_ROWS",
           "MAX_VALUE_BYTES", "MIN_STATEMENT_S", "MYSQL8_SQL_MODE", "NO_TIME_LEFT", "READ_PRAGMAS", "RESULT_LIMIT",
           "SERVER_TEMP_BYTES", "SESSION_PRIVILEGES", "SQLITE_DBCONFIG_DEFENSIVE",
           "SQLITE_DBCONFIG_ENABLE_FTS3_TOKENIZER", "TEMP_BYTES", "TEMP_LIMITS", "WATCH_PERIOD_S", "MariaDBDatabase",
           "MariaDBServer", "ServerAddress", "SharedAccountRefused", "SqliteDatabase", "Table", "authorize",
           "combine_hashes", "defensive", "find_mariadbd", "result_text", "rows_hash", "server_temp_usage",
           "tables_of", "truncate"]
