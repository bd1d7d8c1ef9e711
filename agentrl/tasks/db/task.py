"""`db`: AgentBench-FC's database task: SQL over a per-session database, then a committed answer.

Tools, schemas and the round limit are AgentBench-FC's (`execute_sql`, `commit_final_answer`; 15
rounds). Each session gets a database holding its sample's tables (`backends`): in-memory SQLite by
default, or a database of its own on a MariaDB/MySQL server (AgentBench's engine) with
`backend="mariadb"`: on the server at `mariadb_address`, or on a private mariadbd this task starts on
first use (and stops at exit) when no address is given.

Grading is AgentBench's, rewritten here:
  * SELECT-type samples (`type` other/counting/ranking/comparison/aggregation-*): the committed
    answers and the label are normalized (a "[(v,), ...]" result string becomes its values; quotes,
    "%", thousands separators stripped; none/null/nan/"" become "0") and compared: one value each by
    number (|a-b| <= 0.01) or string; several values by multiset with that tolerance when all are
    numbers, else as sets.
  * INSERT/UPDATE/DELETE samples: the table-state hash of the session's database after the agent's
    statements must equal the sample's `answer_md5` (computed from the gold SQL on a fresh database
    when the sample has none); the committed answers do not matter.

Reward: 1.0 if correct else 0.0, status "completed", metrics {"success": reward}. A statement runs at
most `statement_timeout_s`; observations are AgentBench's (`str()` of the row tuples or the error, cut
at 800 characters).

Splits: with `source="ours"` (default) train/test are this project's generated samples in AgentBench's
format (`data/db/{train,test}.jsonl`, made by `agentrl.tasks.db.data`); with `source="agentbench"`
train = `data/dbbench/db_out_new.jsonl` and test = `data/dbbench/standard.jsonl` of the checkout in
`agentbench_dir` / `AGENTRL_AGENTBENCH_DIR` (AgentBench's own paths). "dev" is AgentBench's dev subset
(60 samples), from the checkout or from this project's copy in `data/agentbench/dbbench/`. A split's
file is read when the split is first used: a checkout with only the test file serves the test split.

Protocol: "strict" (ours: schema-checked calls, our prompt) or "faithful" (AgentBench-FC's loop, prompt
and tool descriptions read from the checkout; `faithful`), the default with `source="agentbench"`.

The scripted expert runs the sample's gold SQL, then commits: the known label for this project's
samples; for AgentBench's, the first column of the gold query's result (a replay of the gold, so its
success rate on "dev" is the gold pass rate of the backend). With `expert_skill` below 1 it plays a share
of the samples wrong (`shared.expert_skilled`): it commits at its first turn, before any SQL, a guess the
label rejects for a question and nothing for a change, which leaves the table as it was.
"""
from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.tasks.agentbench import AgentBenchPrompts, Checkout
from agentrl.tasks.api import EnvError
from agentrl.tasks.db.backends import (
    MYSQL8_SQL_MODE,
    MariaDBDatabase,
    MariaDBServer,
    ServerAddress,
    SharedAccountRefused,
    SqliteDatabase,
    Table,
    server_temp_usage,
)
from agentrl.tasks.db.backends.server import find_mariadbd, template_dir
from agentrl.tasks.db.episode import MAX_ROUNDS, TOOLS, DbEpisode
from agentrl.tasks.db.faithful import PROMPTS, FaithfulDbEpisode
from agentrl.tasks.db.samples import DbSample, load_samples
from agentrl.tasks.options import DbOptions
from agentrl.tasks.protocol import resolve_protocol
from agentrl.tasks.shared import checked_skill, data_root, expert_skilled, split_index, split_indices

log = logging.getLogger(__name__)

DEFAULT_FILES = {"train": "db/train.jsonl", "test": "db/test.jsonl"}
DEV_FILE = "dbbench/dev.jsonl"  # under data/agentbench/ here, data/ in a checkout
AGENTBENCH_FILES = {"train": "data/dbbench/db_out_new.jsonl", "test": "data/dbbench/standard.jsonl",
                    "dev": "data/dbbench/dev.jsonl"}  # configs/tasks/dbbench.yaml: dbbench-env_train, dbbench-std
AGENTBENCH_SQLITE_DIR = "data/dbbench/db_train"  # dbbench-env_train's db_file (not in the public repository)


class DbTask:
    """The `db` task.

    Args:
        backend: "sqlite" (default) or "mariadb".
        mariadb_address: "host:port" or "unix:/path/sock" of a MySQL-compatible server; "" starts a
            private mariadbd on first use (needs mariadb-server installed).
        mariadb_user, mariadb_password: an account that may create databases and users.
        mariadb_sql_mode: the sessions' sql_mode; default MySQL 8's, which AgentBench-FC's container runs
            (see `backends`).
        mariadb_shared_account: allow sessions to share that account when it may not create a user per
            session (no isolation between sessions; logged). Off by default: such a session fails with
            env_error.
        statement_timeout_s: longest time one statement may run (and no longer than what is left of the
            message's budget, `agentrl.tasks.api.time_left`).
        database_mb: the most a session's database may hold: SQLite stops growing there ("database or
            disk is full"); on MariaDB a statement that passes it is stopped and the episode ends as the
            agent's failure (its database is then dropped).
        sqlite_affinity: "text" (AgentBench's all-TEXT schema) or "auto" (see `backends`).
        source, agentbench_dir, data_dir: where samples come from (module docstring). Each split is
            read when first asked for, so a checkout needs only the files of the splits it uses.
        protocol: "faithful" (AgentBench-FC's protocol and prompts, read from the checkout; the default
            with source="agentbench") or "strict" (ours; the default otherwise). See `faithful`.
    """

    name = "db"
    Options = DbOptions  # what `envs.task_options.db` may hold, checked at load
    max_turns = MAX_ROUNDS
    blocking = True

    def __init__(self, backend: str = "sqlite", mariadb_address: str = "", mariadb_user: str = "root",
                 mariadb_password: str = "", mariadb_shared_account: bool = False,
                 mariadb_sql_mode: str = MYSQL8_SQL_MODE, statement_timeout_s: float = 10.0,
                 sqlite_affinity: str = "text", source: str = "ours", agentbench_dir: str | Path | None = None,
                 data_dir: str | Path | None = None, protocol: str | None = None, database_mb: int = 256,
                 expert_skill: float = 1.0) -> None:
        self.expert_skill = checked_skill("db", expert_skill)
        if backend not in ("sqlite", "mariadb"):
            raise ValueError(f"db: unknown backend {backend!r} (sqlite | mariadb)")
        if source not in ("ours", "agentbench"):
            raise ValueError(f"db: unknown source {source!r} (ours | agentbench)")
        if sqlite_affinity not in ("text", "auto"):
            raise ValueError(f"db: unknown sqlite_affinity {sqlite_affinity!r} (text | auto)")
        self.backend = backend
        # Each session a process of its own: SQLite runs in it (memory, the GIL), and so does a MariaDB
        # session's client (a 16 MB row read in the worker's threads held 43-55 MB a session, 410 MB kept
        # after 16) and its private server, one per session (`backends.server`: no global status, lock or
        # counter shared), started from a data directory made here, before the worker forks its sessions.
        self.isolation = "process"
        if backend == "mariadb" and not mariadb_address and find_mariadbd():
            template_dir(str(find_mariadbd()))
        self.timeout_s = float(statement_timeout_s)
        self.database_bytes = int(database_mb) << 20
        self.affinity = sqlite_affinity
        self._address = (ServerAddress.parse(mariadb_address, mariadb_user, mariadb_password)
                         if mariadb_address else None)
        self.shared_account = bool(mariadb_shared_account)
        self.sql_mode = mariadb_sql_mode
        if self.shared_account and backend == "mariadb":
            log.warning("db: mariadb_shared_account is on: where no user per session can be made, sessions "
                        "share the account %s and can reach each other's databases", mariadb_user)
        self._lock = threading.Lock()
        self._reference: dict[int, str] = {}
        root = Path(data_dir) if data_dir else data_root()
        self.checkout = Checkout.find(agentbench_dir)
        if source == "agentbench" and self.checkout is None:
            raise ValueError("db: source='agentbench' needs agentbench_dir or AGENTRL_AGENTBENCH_DIR")
        # split -> (file, ours, sqlite dir); read on first use
        self.files: dict[str, tuple[Path, bool, Path | None]] = {}
        if source == "ours":
            self.files = {split: (root / file, True, None) for split, file in DEFAULT_FILES.items()}
        else:
            assert self.checkout is not None
            sqlite_dir = self.checkout.path(AGENTBENCH_SQLITE_DIR)
            self.files = {split: (self.checkout.path(f), False, sqlite_dir) for split, f in AGENTBENCH_FILES.items()}
        if "dev" not in self.files:
            dev = self.checkout.path(AGENTBENCH_FILES["dev"]) if self.checkout else root / "agentbench" / DEV_FILE
            self.files["dev"] = (dev, False, None)
        self.samples: dict[str, list[DbSample]] = {}
        self.protocol = resolve_protocol(protocol, source == "agentbench", self.name)
        self.faithful: AgentBenchPrompts | None = None  # read from the checkout in the faithful protocol
        if self.protocol == "faithful":
            if self.checkout is None:
                raise ValueError("db: protocol='faithful' reads AgentBench-FC's prompt and tools from a checkout: "
                                 "give agentbench_dir or AGENTRL_AGENTBENCH_DIR")
            self.faithful = AgentBenchPrompts.read(self.checkout, PROMPTS)
            self.max_turns = self.faithful.max_rounds

    def split(self, split: str) -> list[DbSample]:
        """The samples of one split, read from its file on first use."""
        if split not in self.files:
            raise EnvError("bad_request", f"db has no split {split!r} (splits: {', '.join(self.files)})")
        with self._lock:
            if split not in self.samples:
                path, ours, sqlite_dir = self.files[split]
                if not path.is_file():
                    raise FileNotFoundError(f"db: the {split} split's file {path} is missing")
                self.samples[split] = load_samples(path, ours, sqlite_dir)
            return self.samples[split]

    def tools(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.faithful.tools if self.faithful else TOOLS)

    def indices(self, split: str) -> list[str]:
        return split_indices(self.name, split, {split: len(self.split(split))})

    def start(self, index: str) -> DbEpisode:
        split = index.rpartition("-")[0]
        samples = self.split(split) if split in self.files else []
        _, i = split_index(self.name, index, {split: len(samples)})
        skilled = expert_skilled(self.name, index, self.expert_skill)
        if self.faithful is not None:
            return FaithfulDbEpisode(samples[i], self, self.faithful, skilled)
        return DbEpisode(samples[i], self, skilled)

    # ------------------------------------------------------------------------------ databases
    def open_database(self, tables: list[Table], sqlite_file: Path | None = None) -> SqliteDatabase | MariaDBDatabase:
        """A database of the session's own: SQLite; a MariaDB database on the operator's server; or, without
        one, on a private server of its own (`backends.server`), stopped when the database closes."""
        if self.backend == "sqlite":
            return SqliteDatabase(tables, self.timeout_s, self.affinity, sqlite_file, self.database_bytes)
        if sqlite_file is not None:
            raise ValueError("this sample is an SQLite database file; use backend='sqlite'")
        server = MariaDBServer().start() if self._address is None else None
        address = server.address if server is not None else self._address
        assert address is not None
        try:
            return MariaDBDatabase(address, tables, self.timeout_s, allow_shared_account=self.shared_account,
                                   sql_mode=self.sql_mode, quota_bytes=self.database_bytes,
                                   temp_usage=self._temp_usage(address),
                                   on_close=server.stop if server is not None else None)
        except SharedAccountRefused as e:
            raise EnvError("env_error", f"db: {e}") from e

    def _temp_usage(self, address: ServerAddress) -> Callable[[], int] | None:
        """The server's temporary files (`server_temp_usage`): of each private server, once of the operator's."""
        if self._address is None:
            return server_temp_usage(address)
        with self._lock:
            if not hasattr(self, "_temp"):
                self._temp = server_temp_usage(address)
            return self._temp

    def reference_hash(self, sample: DbSample) -> str:
        """The table hash after the gold SQL, on a fresh database (samples without `answer_md5`)."""
        key = id(sample)
        if key not in self._reference:
            db = self.open_database(sample.tables, sample.sqlite_file)
            try:
                if sample.gold_sql:
                    db.execute(sample.gold_sql)
                self._reference[key] = db.table_hash(sample.tables)
            finally:
                db.close()
        return self._reference[key]

    def close(self) -> None:
        """Stop the private server, if this task started one."""
        pass  # each private server goes with its database

