"""The db gold replay: SELECT-type samples commit their label; INSERT/UPDATE/DELETE samples run their
gold SQL, then commit (graded by the table hash); a failure classified with its evidence."""
from __future__ import annotations

import re
from typing import Any

from agentrl.checks.replay.classes import DATA, OURS, Outcome
from agentrl.serving.session import Session
from agentrl.tasks.api import EnvError
from agentrl.tasks.db import MODIFY, DbSample, DbTask, answers_match
from agentrl.tasks.shared import call_message
from agentrl.types import Status

STRICT_ERRORS = re.compile(r"^Error (1292|1265|1366|1264|1406|1048):")
"""MySQL errors that strict sql_mode raises where the non-strict mode only warns (truncated or
out-of-range values, bad conversions)."""

BAD_NAMES = re.compile(r"\((1166|1103|1059|1060),")
"""MySQL's errors for a table definition it refuses: incorrect column or table name, name too long,
duplicate column name."""


def replay_db(task: DbTask, index: str) -> Outcome:
    """The gold answer of one db sample, replayed; a failure classified with its evidence."""
    split, _, num = index.rpartition("-")
    sample = task.split(split)[int(num)]
    try:
        session = Session(task, index)
    except EnvError as e:
        if BAD_NAMES.search(e.message):
            return False, DATA, (f"MySQL rejects the sample's own tables ({e.message.split(': ', 1)[-1]}): "
                                 "AgentBench-FC's CREATE TABLE for them is the same, so it cannot start there either")
        return False, OURS, f"did not start: {e.message}"
    try:
        observation = ""
        if sample.kind in MODIFY:
            r = session.interact(call_message([("execute_sql", {"query": sample.gold_sql or ""})], 0))
            observation = str(r.messages[0]["content"]) if r.messages else ""
            answers: Any = []
        else:
            answers = sample.label
        r = session.interact(call_message([("commit_final_answer", {"answers": answers})], 1))
    finally:
        session.close()
    if r.status == Status.COMPLETED and r.reward == 1.0:
        return True, "", ""
    if r.status == Status.ENV_ERROR:
        return False, OURS, f"env_error: {r.error}"
    if sample.kind in MODIFY:
        return _classify_hash_failure(task, sample, observation)
    return False, OURS, f"label {sample.label!r} does not pass its own grader"


def _classify_hash_failure(task: DbTask, sample: DbSample, observation: str) -> Outcome:
    """A gold SQL whose table hash is not the sample's answer_md5: a data defect when the gold SQL fails
    in strict mode (MySQL 8's default, which AgentBench-FC's mysql:8 container runs) and reaches the
    answer_md5 without it: the hash was made elsewhere, and AgentBench-FC's own setup fails it too."""
    if task.backend == "mariadb" and STRICT_ERRORS.match(observation):
        lax = DbTask(backend="mariadb", mariadb_address=_address(task), mariadb_sql_mode="",
                     mariadb_shared_account=task.shared_account)
        db = lax.open_database(sample.tables)
        try:
            db.execute(sample.gold_sql or "")
            reached = lax_match(db.table_hash(sample.tables), sample)
        finally:
            db.close()
        if reached:
            return False, DATA, (f"the gold SQL fails in MySQL 8's strict mode ({observation[:120]}) and "
                                 "reaches answer_md5 only without it")
    if task.backend == "mariadb" and not observation.startswith("Error"):
        # two engines that agree on the gold's table, against an answer_md5 neither reaches
        hashes = {}
        for engine in (task, DbTask(backend="sqlite")):
            db = engine.open_database(sample.tables)
            try:
                db.execute(sample.gold_sql or "")
                hashes[db.kind] = db.table_hash(sample.tables)
            finally:
                db.close()
        if len(set(hashes.values())) == 1:
            return False, DATA, (f"MariaDB and SQLite agree on the table after the gold SQL (hash "
                                 f"{hashes['mariadb']}); answer_md5 {sample.answer_md5} is neither's")
    return False, OURS, f"gold SQL observation: {observation[:160]}"


def lax_match(table_hash: str, sample: DbSample) -> bool:
    return answers_match(table_hash, sample.answer_md5, sample.kind)


def _address(task: DbTask) -> str:
    """The task's server option: the operator's server, or "" (a private server per database)."""
    address = task._address
    if address is None:
        return ""
    return f"unix:{address.unix_socket}" if address.unix_socket else f"{address.host}:{address.port}"

