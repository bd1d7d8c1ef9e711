"""`db`: AgentBench-FC's database task: SQL over a per-session database, then a committed answer.

Tools, schemas and the round limit are AgentBench-FC's (`execute_sql`, `commit_final_answer`; 15
rounds). Each session gets a database holding its sample's tables (`db_backends`): in-memory SQLite by
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
format (`data/db/{train,test}.jsonl`, made by `agentrl.envs.tasks.db_data`); with `source="agentbench"`
train = `data/dbbench/db_out_new.jsonl` and test = `data/dbbench/standard.jsonl` of the checkout in
`agentbench_dir` / `AGENTRL_AGENTBENCH_DIR` (AgentBench's own paths). "dev" is AgentBench's dev subset
(60 samples), from the checkout or from this project's copy in `data/agentbench/dbbench/`. A split's
file is read when the split is first used: a checkout with only the test file serves the test split.

Protocol: "strict" (ours: schema-checked calls, our prompt) or "faithful" (AgentBench-FC's loop, prompt
and tool descriptions read from the checkout; `db_faithful`), the default with `source="agentbench"`.

The scripted expert runs the sample's gold SQL, then commits: the known label for this project's
samples; for AgentBench's, the first column of the gold query's result (a replay of the gold, so its
success rate on "dev" is the gold pass rate of the backend).
"""
from __future__ import annotations

import ast
import atexit
import copy
import json
import logging
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from agentrl.envs.api import Action, EnvError, StepResult, tool_message
from agentrl.envs.protocol import resolve_protocol
from agentrl.envs.tasks.agentbench import Checkout
from agentrl.envs.tasks.db_backends import (
    MYSQL8_SQL_MODE,
    MariaDBDatabase,
    MariaDBServer,
    ServerAddress,
    SharedAccountRefused,
    SqliteDatabase,
    Table,
    tables_of,
)
from agentrl.envs.tasks.shared import call_message, data_root, split_index, split_indices
from agentrl.types import Status

log = logging.getLogger(__name__)

MAX_ROUNDS = 15
MODIFY = ("INSERT", "UPDATE", "DELETE")

# AgentBench-FC's tool schemas (configs/tasks/dbbench.yaml), unchanged.
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "execute_sql",
        "description": "Executes a given SQL statement on the database and returns the result.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "The SQL query to be executed."}},
            "required": ["query"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "commit_final_answer",
        "description": "Commits the final answer after all operations are completed.",
        "parameters": {"type": "object", "properties": {
            "answers": {"type": "array", "items": {"type": "string"},
                        "description": "The list of final answers to commit."}},
            "required": ["answers"], "additionalProperties": False}}},
]

SYSTEM_PROMPT = (
    "You will answer a question about a MySQL database, or change the database as asked, by running SQL. "
    "Call execute_sql with one SQL statement at a time; you get the raw result back (a list of row tuples, or "
    "an error). When you are done, call commit_final_answer with the list of answer values; if the task was to "
    "change the database, the answers can be anything. Answer exactly: the answer values must match the correct "
    "ones. Always use the tools; an answer written in the message text does not count.")


# ----------------------------------------------------------------------------------------------- grading

_SPECIAL = {"none", "null", "undefined", "nan", "inf", "infinity", "-inf", "-infinity", ""}


def normalize_value(value: Any) -> str:
    """One answer value as AgentBench compares it."""
    if value is None:
        return "0"
    text = str(value).strip()
    if text.endswith("%"):
        return text[:-1].strip()
    if "," in text and not text.startswith("[") and not text.endswith("]"):
        text = text.replace(",", "")
    return "0" if text.lower() in _SPECIAL else text


def _strip(value: Any) -> str:
    return str(value).strip().strip("'\"")


def _result_values(text: str) -> list[str] | None:
    """The values of a "[(v,), (w,)]" result string (one-column rows only), or None if it is not one."""
    if not (text.startswith("[") and text.endswith("]")):
        return None
    try:
        parsed = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        inner = text.strip("[]")
        if inner.count("(") == 1 and inner.startswith("(") and inner.endswith(",)"):
            return [inner[1:-2].strip().strip("'\"")]
        return None
    if isinstance(parsed, list) and all(isinstance(x, tuple) for x in parsed):
        return [_strip(x[0]) for x in parsed if len(x) == 1]
    return None


def _split_list(inner: str) -> list[str]:
    items, current, quoted = [], "", False
    for ch in inner:
        if ch in "'\"":
            quoted = not quoted
        elif ch == "," and not quoted:
            if current:
                items.append(normalize_value(_strip(current)))
            current = ""
        else:
            current += ch
    if current:
        items.append(normalize_value(_strip(current)))
    return items


def clean_answers(answer: Any) -> list[str]:
    """Committed answers or a label as the list of normalized strings that grading compares."""
    if answer is None:
        return ["0"]
    if isinstance(answer, str):
        values = _result_values(answer)
        if values is not None:
            return [normalize_value(v) for v in values]
        text = answer.strip()
        if text.startswith("[") and text.endswith("]"):
            try:
                parsed = ast.literal_eval(text)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                return _split_list(text[1:-1])
            if isinstance(parsed, list):
                return [normalize_value(_strip(x[0] if isinstance(x, tuple) and len(x) == 1 else x)) for x in parsed]
        return [normalize_value(_strip(text))]
    if isinstance(answer, (list, tuple)):
        return [normalize_value(_strip(x[0] if isinstance(x, tuple) and len(x) == 1 else x)) for x in answer]
    return [normalize_value(_strip(answer))]


def _is_float(text: str) -> bool:
    try:
        float(text)
    except (ValueError, TypeError):
        return False
    return True


def _close(a: str, b: str, tol: float = 1e-2) -> bool:
    return abs(float(a) - float(b)) <= tol


def answers_match(answer: Any, truth: Any, kind: str, no_extra: bool = False) -> bool:
    """AgentBench's comparison of committed answers (or a table hash) with the ground truth.

    no_extra: also fail an answer that repeats a value more often than the truth holds it (AgentBench
        compares several non-numeric values as sets, so ["Fantasy", "Fantasy"] passes for ["Fantasy"]:
        a policy could pad answers for free). The strict protocol sets it; the faithful one keeps
        AgentBench's sets.
    """
    got, want = clean_answers(answer), clean_answers(truth)
    if no_extra and kind not in MODIFY:
        have = Counter(want)
        if any(n > 1 and n > have[value] for value, n in Counter(got).items()):  # a repeated value, padded
            return False
    if kind in MODIFY:
        return got == want
    if len(got) == 1 and len(want) == 1:
        a, b = got[0], want[0]
        if _is_float(a) and _is_float(b):
            return _close(a, b)
        return a == b
    if all(map(_is_float, got)) and all(map(_is_float, want)):
        if len(got) != len(want):
            return False
        unused = list(want)
        for a in got:
            hit = next((i for i, b in enumerate(unused) if _close(a, b)), None)
            if hit is None:
                return False
            unused.pop(hit)
        return True
    return set(got) == set(want)


# ------------------------------------------------------------------------------------------ samples

class DbSample:
    """One entry of an AgentBench dbbench file, with what grading and the expert need."""

    def __init__(self, entry: dict[str, Any], ours: bool, sqlite_dir: Path | None = None) -> None:
        self.entry = entry
        self.ours = ours
        self.kind = str(entry["type"][0])
        self.tables: list[Table] = tables_of(entry)
        self.description = str(entry["description"])
        self.label = entry.get("label")
        self.answer_md5 = entry.get("answer_md5") if self.kind in MODIFY else None
        sql = entry.get("sql")
        gold = sql.get("query") if isinstance(sql, dict) else None
        if not gold and self.kind in MODIFY and isinstance(self.label, list) and self.label:
            gold = str(self.label[0])  # AgentBench's modification samples keep their SQL in `label`
        self.gold_sql: str | None = gold
        self.sqlite_file: Path | None = None
        if entry.get("user_sqlite"):
            if sqlite_dir is None:
                raise ValueError("a user_sqlite sample needs the checkout's db_train directory")
            self.sqlite_file = sqlite_dir / entry["create"]["database"] / entry["create"]["init"]

    def prompt(self) -> str:
        text = ""
        if self.entry.get("evidence"):
            text += f"Evidence about the question: {self.entry['evidence']}\n"
        if self.entry.get("add_description"):
            text += f"Additional table information about the question: {self.entry['add_description']}\n"
        return text + f"Question: {self.description}\n"


def load_samples(path: Path, ours: bool, sqlite_dir: Path | None = None) -> list[DbSample]:
    """All entries of a .jsonl (or .json list) dbbench file."""
    text = path.read_text(encoding="utf-8")
    entries = json.loads(text) if path.suffix == ".json" else [json.loads(x) for x in text.splitlines() if x.strip()]
    samples = []
    for n, entry in enumerate(entries):
        try:
            samples.append(DbSample(entry, ours, sqlite_dir))
        except (KeyError, TypeError, IndexError, ValueError) as e:
            raise ValueError(f"{path} entry {n}: not in AgentBench's dbbench format ({type(e).__name__}: {e})") from e
    return samples


# ------------------------------------------------------------------------------------------ episodes

class DbEpisode:
    def __init__(self, sample: DbSample, task: DbTask) -> None:
        self.sample = sample
        self.task = task
        self.db = task.open_database(sample.tables, sample.sqlite_file)
        self.steps = 0  # steps taken so far: the expert's call ids
        self.ran_gold = False  # whether the gold SQL has been run (drives the expert)

    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": self.sample.prompt()}]

    def step(self, action: Action) -> StepResult:
        self.steps += 1
        messages: list[dict[str, Any]] = []
        for call in action.tool_calls:
            if call.name == "execute_sql":
                self.ran_gold = self.ran_gold or call.arguments["query"] == self.sample.gold_sql
                result = self.db.execute(call.arguments["query"])
                messages.append(tool_message(call.id, call.name, result or "No response from database."))
                continue
            reward = 1.0 if self.judge(call.arguments["answers"]) else 0.0
            messages.append(tool_message(call.id, call.name, "Your answer has been committed."))
            return StepResult(messages=messages, done=True, reward=reward, status=Status.COMPLETED,
                              metrics={"success": reward})
        return StepResult(messages=messages, metrics={"success": 0.0})

    def judge(self, answers: list[str]) -> bool:
        s = self.sample
        if s.kind in MODIFY:
            truth = s.answer_md5 or self.task.reference_hash(s)
            return answers_match(self.db.table_hash(s.tables), truth, s.kind)
        return answers_match(answers, s.label, s.kind, no_extra=True)

    def expert_message(self) -> dict[str, Any]:
        # A function of the episode's state, not of how often it is asked: asking twice gives one move.
        turn, s = self.steps, self.sample
        if s.gold_sql and not self.ran_gold:
            return call_message([("execute_sql", {"query": s.gold_sql})], turn)
        if s.kind in MODIFY:
            answers: list[str] = []
        elif s.ours:
            answers = [str(x) for x in s.label or []]
        else:
            answers = self._first_column()
        return call_message([("commit_final_answer", {"answers": answers})], turn)

    def _first_column(self) -> list[str]:
        # The gold query's result, run again on a fresh copy so the agent's statements cannot change it.
        if not self.sample.gold_sql:
            return []
        db = self.task.open_database(self.sample.tables, self.sample.sqlite_file)
        try:
            text = db.execute(self.sample.gold_sql)
        finally:
            db.close()
        try:
            rows = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return []  # an error, or a result that did not fit in the observation
        return [str(row[0]) for row in rows if isinstance(row, tuple) and row] if isinstance(rows, list) else []

    def close(self) -> None:
        self.db.close()


DEFAULT_FILES = {"train": "db/train.jsonl", "test": "db/test.jsonl"}
DEV_FILE = "dbbench/dev.jsonl"  # under data/agentbench/ here, data/ in a checkout
AGENTBENCH_FILES = {"train": "data/dbbench/db_out_new.jsonl", "test": "data/dbbench/standard.jsonl",
                    "dev": "data/dbbench/dev.jsonl"}  # configs/tasks/dbbench.yaml: dbbench-env_train, dbbench-std
AGENTBENCH_SQLITE_DIR = "data/dbbench/db_train"  # dbbench-env_train's db_file (not in the public repository)
AGENTBENCH_PROMPT = "src/server/tasks/dbbench/task.py"
AGENTBENCH_CONFIG = "configs/tasks/dbbench.yaml"


class DbTask:
    """The `db` task.

    Args:
        backend: "sqlite" (default) or "mariadb".
        mariadb_address: "host:port" or "unix:/path/sock" of a MySQL-compatible server; "" starts a
            private mariadbd on first use (needs mariadb-server installed).
        mariadb_user, mariadb_password: an account that may create databases and users.
        mariadb_sql_mode: the sessions' sql_mode; default MySQL 8's, which AgentBench-FC's container runs
            (see `db_backends`).
        mariadb_shared_account: allow sessions to share that account when it may not create a user per
            session (no isolation between sessions; logged). Off by default: such a session fails with
            env_error.
        statement_timeout_s: longest time one statement may run.
        sqlite_affinity: "text" (AgentBench's all-TEXT schema) or "auto" (see `db_backends`).
        source, agentbench_dir, data_dir: where samples come from (module docstring). Each split is
            read when first asked for, so a checkout needs only the files of the splits it uses.
        protocol: "faithful" (AgentBench-FC's protocol and prompts, read from the checkout; the default
            with source="agentbench") or "strict" (ours; the default otherwise). See `db_faithful`.
    """

    name = "db"
    max_turns = MAX_ROUNDS
    blocking = True

    def __init__(self, backend: str = "sqlite", mariadb_address: str = "", mariadb_user: str = "root",
                 mariadb_password: str = "", mariadb_shared_account: bool = False,
                 mariadb_sql_mode: str = MYSQL8_SQL_MODE, statement_timeout_s: float = 10.0,
                 sqlite_affinity: str = "text", source: str = "ours", agentbench_dir: str | Path | None = None,
                 data_dir: str | Path | None = None, protocol: str | None = None) -> None:
        if backend not in ("sqlite", "mariadb"):
            raise ValueError(f"db: unknown backend {backend!r} (sqlite | mariadb)")
        if source not in ("ours", "agentbench"):
            raise ValueError(f"db: unknown source {source!r} (ours | agentbench)")
        if sqlite_affinity not in ("text", "auto"):
            raise ValueError(f"db: unknown sqlite_affinity {sqlite_affinity!r} (text | auto)")
        self.backend = backend
        self.timeout_s = float(statement_timeout_s)
        self.affinity = sqlite_affinity
        self._address = (ServerAddress.parse(mariadb_address, mariadb_user, mariadb_password)
                         if mariadb_address else None)
        self._server: MariaDBServer | None = None
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
        self.faithful: Any = None  # db_faithful.FaithfulPrompts in the faithful protocol
        self._episode: Any = DbEpisode
        if self.protocol == "faithful":
            from agentrl.envs.tasks.db_faithful import FaithfulDbEpisode, FaithfulPrompts  # it subclasses DbEpisode

            self._episode = FaithfulDbEpisode
            if self.checkout is None:
                raise ValueError("db: protocol='faithful' reads AgentBench-FC's prompt and tools from a checkout: "
                                 "give agentbench_dir or AGENTRL_AGENTBENCH_DIR")
            self.faithful = FaithfulPrompts.read(self.checkout)
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
        episode: DbEpisode = self._episode(samples[i], self)
        return episode

    # ------------------------------------------------------------------------------ databases
    def server_address(self) -> ServerAddress:
        """The MariaDB server sessions use: the given one, or a private one started on first use."""
        if self._address is not None:
            return self._address
        with self._lock:
            if self._server is None:
                self._server = MariaDBServer().start()
                atexit.register(self._server.stop)
                log.info("db: started a private mariadbd at %s", self._server.socket)
            return self._server.address

    def open_database(self, tables: list[Table], sqlite_file: Path | None = None) -> SqliteDatabase | MariaDBDatabase:
        if self.backend == "sqlite":
            return SqliteDatabase(tables, self.timeout_s, self.affinity, sqlite_file)
        if sqlite_file is not None:
            raise ValueError("this sample is an SQLite database file; use backend='sqlite'")
        try:
            return MariaDBDatabase(self.server_address(), tables, self.timeout_s,
                                   allow_shared_account=self.shared_account, sql_mode=self.sql_mode)
        except SharedAccountRefused as e:
            raise EnvError("env_error", f"db: {e}") from e

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
        if self._server is not None:
            self._server.stop()
            self._server = None

