"""The `db` task on MariaDB, AgentBench's engine: a private server started as the worker would, a
database and a user per session, AgentBench's answer_md5 on its dev INSERT/UPDATE samples, the same
hashes as SQLite on our samples, statement time limits, and cleanup. Skipped where mariadbd is missing
(.ci/run installs it)."""
from __future__ import annotations

from typing import Any

import pytest
from env_helpers import call, expert_reward

from agentrl.envs.api import Session
from agentrl.envs.tasks.db import DbTask
from agentrl.envs.tasks.db_backends import MariaDBServer, find_mariadbd

pytestmark = pytest.mark.skipif(find_mariadbd() is None, reason="mariadbd is not installed "
                                "(apt-get install --no-install-recommends mariadb-server)")


@pytest.fixture(scope="module")
def server() -> Any:
    s = MariaDBServer().start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def task(server: MariaDBServer) -> DbTask:
    return DbTask(backend="mariadb", mariadb_address=f"unix:{server.socket}", statement_timeout_s=1.0)


def databases(server: MariaDBServer) -> set[str]:
    conn = server.address.connect()
    with conn.cursor() as cur:
        cur.execute("SHOW DATABASES")
        names = {r[0] for r in cur.fetchall()}
    conn.close()
    return {n for n in names if n.startswith("agentrl_")}


def test_gold_sql_passes_answer_md5_on_dev(task: DbTask) -> None:
    dev = list(zip(task.indices("dev"), task.split("dev")))
    inserts = [i for i, s in dev if s.kind == "INSERT"][:6]
    updates = [i for i, s in dev if s.kind == "UPDATE"][:6]
    assert sum(expert_reward(task, i) for i in inserts + updates) == 12


def test_our_samples_hash_the_same_as_on_sqlite(task: DbTask) -> None:
    indices = task.indices("test")[:16]  # two of each question type, INSERT/UPDATE/DELETE graded by hash
    assert sum(expert_reward(task, i) for i in indices) == 16


def test_sessions_are_isolated_limited_and_dropped(task: DbTask, server: MariaDBServer) -> None:
    before = databases(server)
    a, b = Session(task, "train-0"), Session(task, "train-1")
    assert len(databases(server) - before) == 2
    r = a.interact(call("execute_sql", {"query": "SHOW DATABASES"}))
    assert r.messages[0]["content"] == f"[('{a.episode.db.name}',), ('information_schema',)]"  # not b's
    r = a.interact(call("execute_sql", {"query": f"DROP DATABASE {b.episode.db.name}"}, "c1"))
    assert r.messages[0]["content"].startswith("Error 1044: Access denied")
    r = a.interact(call("execute_sql", {"query": "SELECT SLEEP(30)"}, "c2"))  # stopped after 1 s
    assert r.messages[0]["content"] == "Error 1969: Query execution was interrupted (max_statement_time exceeded)"
    r = a.interact(call("execute_sql", {"query": "SELECT 2"}, "c3"))
    assert r.messages[0]["content"] == "[(2,)]"
    r = a.interact(call("execute_sql", {"query": "SELEC 1"}, "c4"))
    assert r.messages[0]["content"].startswith("Error 1064: You have an error in your SQL syntax")
    a.interact(call("commit_final_answer", {"answers": []}, "c5"))  # ends: its database goes
    assert len(databases(server) - before) == 1
    b.close()
    assert databases(server) == before


def test_private_server_starts_and_stops() -> None:
    s = MariaDBServer().start()
    sock = s.socket
    t = DbTask(backend="mariadb", mariadb_address=f"unix:{sock}")
    assert expert_reward(t, "train-5") == 1.0
    s.stop()
    assert not s.dir.exists()
