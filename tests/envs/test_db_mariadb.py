"""The `db` task on MariaDB, AgentBench's engine: a private server started as the worker would, a
database and a user per session (or a failed session, unless sharing is explicitly allowed), AgentBench's
answer_md5 on its dev INSERT/UPDATE samples, the same hashes as SQLite on our samples, any identifier
AgentBench uses, AgentBench-FC's sql_mode, statement time limits, and cleanup. Skipped where mariadbd is missing
(.ci/run installs it)."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from agentbench_checkout import build_checkout
from env_helpers import call, expert_reward
from system_tools import missing_system_tool

from agentrl.checks.replay import run_checks
from agentrl.serving.session import Session
from agentrl.tasks.api import EnvError
from agentrl.tasks.db import DbTask
from agentrl.tasks.db.backends import MYSQL8_SQL_MODE, MariaDBServer, find_mariadbd, rows_hash
from agentrl.types import Status


@pytest.fixture(scope="module", autouse=True)
def mariadbd_installed() -> None:
    if find_mariadbd() is None:  # skipped with the reason here; a failure in CI, which installs it
        missing_system_tool("mariadbd is not installed (apt-get install --no-install-recommends mariadb-server)")


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


def queries_of(server: MariaDBServer, user: str) -> list[Any]:
    conn = server.address.connect()
    with conn.cursor() as cur:
        cur.execute("SELECT ID, COMMAND, INFO FROM information_schema.PROCESSLIST WHERE USER = %s", (user,))
        rows = list(cur.fetchall())
    conn.close()
    return rows


ENDLESS = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
           "SELECT COUNT(*) FROM c")


def test_a_session_cannot_lift_its_limits_and_its_queries_end_with_it(task: DbTask, server: MariaDBServer) -> None:
    """On c07c523 a session raised its own max_statement_time and max_recursive_iterations and
    an endless recursive CTE ran on past the call's deadline and after the session was closed."""
    import threading
    import time

    from agentrl.tasks.db.backends import MariaDBDatabase

    s = Session(task, "train-0")
    user = s.episode.db.user
    for i, q in enumerate(("SET SESSION max_statement_time = 0", "SET SESSION max_recursive_iterations = 4294967295")):
        assert s.interact(call("execute_sql", {"query": q}, f"c{i}")).messages[0]["content"] == "[]"
    t = time.monotonic()
    r = s.interact(call("execute_sql", {"query": ENDLESS}, "c9"))
    took = time.monotonic() - t
    assert took < 6.0, took  # the 1 s limit, the watchdog's 2 s grace, margin
    assert "interrupted" in r.messages[0]["content"], r.messages
    assert [q for q in queries_of(server, user) if q[1] == "Query"] == []
    s.close()
    # a statement still running when its session closes (its call outlived the worker's deadline) ends too
    db = MariaDBDatabase(server.address, [], timeout_s=60.0)
    db.execute("SET SESSION max_statement_time = 0")
    db.execute("SET SESSION max_recursive_iterations = 4294967295")
    runner = threading.Thread(target=db.execute, args=(ENDLESS,), daemon=True)
    runner.start()
    time.sleep(0.5)
    t = time.monotonic()
    db.close()
    assert time.monotonic() - t < 5.0
    runner.join(timeout=5.0)
    assert not runner.is_alive() and queries_of(server, str(db.user)) == []


def test_private_server_starts_and_stops() -> None:
    s = MariaDBServer().start()
    sock = s.socket
    t = DbTask(backend="mariadb", mariadb_address=f"unix:{sock}")
    assert expert_reward(t, "train-5") == 1.0
    s.stop()
    assert not s.dir.exists()


ODD_NAMES = ("%", "Win %", "Foreign nationals in %", "2007", "15 to 17", "Men's team", 'say "hi"', "back`tick")


def test_any_identifier_agentbench_uses_works(server: MariaDBServer, tmp_path: Path) -> None:
    """Names from AgentBench's test split: `%` (PyMySQL's executemany formats the whole query), digits
    first, spaces, quotes; a table whose name starts with digits. The gold INSERT reaches the hash."""
    rows = [[str(i) + "%", *(f"v{i}{j}" for j in range(1, len(ODD_NAMES)))] for i in range(3)]
    cols = ", ".join("`" + c.replace("`", "``") + "`" for c in ODD_NAMES)
    new = ["9%", *(f"n{j}" for j in range(1, len(ODD_NAMES)))]
    gold = f"INSERT INTO `1952_British_Grand_Prix_0` ({cols}) VALUES ({', '.join(repr(v) for v in new)})"
    entry = {"description": "Add a row.", "type": ["INSERT"], "label": [gold], "add_description": "",
             "table": {"table_name": "1952_British_Grand_Prix_0", "table_info": {
                 "columns": [{"name": c, "type": "TEXT"} for c in ODD_NAMES], "rows": rows}},
             "answer_md5": f"[('{rows_hash([tuple(r) for r in rows + [new]])}',)]"}
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "test.jsonl").write_text(json.dumps(entry) + "\n")  # no train file: not needed
    task = DbTask(backend="mariadb", mariadb_address=f"unix:{server.socket}", data_dir=tmp_path)
    s = Session(task, "test-0")
    r = s.interact(call("execute_sql", {"query": "SELECT `%`, `Win %`, `Men's team` FROM `1952_British_Grand_Prix_0`"}))
    assert r.messages[0]["content"] == "[('0%', 'v01', 'v05'), ('1%', 'v11', 'v15'), ('2%', 'v21', 'v25')]"
    s.close()
    assert expert_reward(task, "test-0") == 1.0


def test_sql_mode_is_mysql8_default_as_agentbench_fc_runs(task: DbTask) -> None:
    """AgentBench-FC's mysql:8 container runs MySQL 8's default sql_mode: strict. An UPDATE whose WHERE
    compares text that is no number with a number is an error there (1292), not a warning."""
    s = Session(task, "train-0")
    r = s.interact(call("execute_sql", {"query": "SELECT @@SESSION.sql_mode"}))
    assert r.messages[0]["content"] == f"[('{MYSQL8_SQL_MODE}',)]"
    table = s.episode.sample.tables[0]
    r = s.interact(call("execute_sql", {"query": f"UPDATE `{table.name}` SET `{table.columns[1]}` = 'x' "
                                                 f"WHERE `{table.columns[0]}` = 16"}, "c1"))
    assert r.messages[0]["content"].startswith("Error 1292: Truncated incorrect DECIMAL value")
    s.close()


@pytest.fixture(scope="module")
def limited(server: MariaDBServer) -> str:
    """An account that may create `agentrl_*` databases but no users (as on a shared server)."""
    conn = server.address.connect()
    with conn.cursor() as cur:
        cur.execute("CREATE USER 'limited'@'localhost' IDENTIFIED BY 'pw'")
        cur.execute("GRANT ALL PRIVILEGES ON `agentrl\\_%`.* TO 'limited'@'localhost'")
    conn.close()
    return "limited"


def test_no_silent_shared_account(server: MariaDBServer, limited: str, caplog: pytest.LogCaptureFixture) -> None:
    before = databases(server)
    task = DbTask(backend="mariadb", mariadb_address=f"unix:{server.socket}", mariadb_user=limited,
                  mariadb_password="pw")
    with caplog.at_level(logging.ERROR, logger="agentrl.tasks.db.backends"), pytest.raises(EnvError) as e:
        Session(task, "train-0")
    assert e.value.code == "env_error" and "cannot create a MariaDB user per session" in e.value.message
    assert any("the session fails" in r.getMessage() for r in caplog.records)
    assert databases(server) == before  # its database was dropped again


def test_shared_account_is_an_explicit_logged_opt_in(server: MariaDBServer, limited: str,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        task = DbTask(backend="mariadb", mariadb_address=f"unix:{server.socket}", mariadb_user=limited,
                      mariadb_password="pw", mariadb_shared_account=True)
        assert expert_reward(task, "train-0") == 1.0
    messages = [r.getMessage() for r in caplog.records]
    assert any("mariadb_shared_account is on" in m for m in messages)
    assert any("shares the account limited" in m for m in messages)


def test_agentbench_check_on_mariadb_names_a_data_defect(tmp_path: Path) -> None:
    """AgentBench's dev-5 has a column named '': MySQL refuses its table, as AgentBench-FC's own would."""
    checkout = build_checkout(tmp_path)
    report = run_checks(checkout, ["db"], "dev", backend="mariadb", limit=8, workers=2)
    assert report["db"]["dev"]["passed"] == 7 and report["db"]["dev"]["failures"] == {"data defect": ["dev-5"]}


def test_results_temporary_storage_and_disk_are_bounded(server: MariaDBServer) -> None:
    """On 5d8debb the client library read a whole result set first (+1.39 GB for one
    statement), a session's temporary tables and files grew 750 MB in 10 s with no quota, and a result the
    decoder rejected ended the episode as env_error."""
    import resource

    task = DbTask(backend="mariadb", mariadb_address=f"unix:{server.socket}", statement_timeout_s=5.0, database_mb=8)
    s = Session(task, "train-0")

    def sql(query: str) -> str:
        r = s.interact(call("execute_sql", {"query": query}))
        assert not r.done, r
        return str(r.messages[0]["content"])

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = sql("SELECT REPEAT('x', 16000000) FROM seq_1_to_30")  # 480 MB of result
    assert out.startswith("[('xxxx") and out.endswith("[TRUNCATED]")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 100 << 10  # KiB: rows streamed, not held
    assert sql("SELECT 1") == "[(1,)]"
    assert sql("CREATE TEMPORARY TABLE t (a INT)").startswith("Error 1044: Access denied")
    sql("SET SESSION tmp_disk_table_size = 100000000000")
    assert sql("SELECT @@tmp_disk_table_size") == f"[({64 << 20},)]"  # the server's maximum holds
    sql("SET SESSION max_recursive_iterations = 4294967295")
    out = sql("WITH RECURSIVE c(x, s) AS (SELECT 1, REPEAT('x', 100000) UNION ALL SELECT x + 1, s FROM c) "
              "SELECT COUNT(*) FROM c")
    assert out == "Error 1114: The table '(temporary)' is full"
    sql("SET character_set_results = latin1")
    assert sql("SELECT 'é'").startswith("Error: the result is not valid utf-8 text")
    assert sql("SELECT 2") == "[(2,)]"  # a fresh connection
    # a lone surrogate is refused where the arguments are read, before the statement reaches a backend
    assert sql("SELECT '\ud800'").startswith("Error: arguments are not valid JSON here (an unpaired surrogate")
    name = s.episode.db.name
    assert sql("CREATE TABLE big (a LONGTEXT)") == "[]"
    r = s.interact(call("execute_sql", {"query": "INSERT INTO big SELECT REPEAT('x', 1000000) FROM seq_1_to_200"}))
    assert (r.done, r.status, r.metrics.get("over_budget")) == (True, Status.INVALID_ACTION, 1.0), r
    assert "quota of 8 MB" in r.messages[-1]["content"]
    assert name not in databases(server)  # the session's disk went with it


def test_the_servers_temporary_files_are_bounded(server: MariaDBServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sort of 10^8 generated rows wrote 1.65 GB of the server's temporary files in 10 s: while they pass
    the bound (512 MB; 32 MB here), the statement is stopped with an observation."""
    from agentrl.tasks.db.backends import mariadb

    monkeypatch.setattr(mariadb, "SERVER_TEMP_BYTES", 32 << 20)
    task = DbTask(backend="mariadb", mariadb_address=f"unix:{server.socket}", statement_timeout_s=20.0)
    s = Session(task, "train-0")
    r = s.interact(call("execute_sql", {"query": "SELECT REPEAT(a.seq, 1000) AS x FROM seq_1_to_100000000 a ORDER BY x"}))
    assert r.messages[0]["content"] == ("Error: the server's temporary files passed 32 MB while the statement ran; "
                                        "it was stopped"), r.messages
    assert s.interact(call("execute_sql", {"query": "SELECT 1"}, "c1")).messages[0]["content"] == "[(1,)]"
    s.close()


def test_a_private_server_goes_with_a_worker_killed_outright(tmp_path: Path) -> None:
    """mariadbd runs in a session of its own, so the group kill that ends a role misses it; a worker SIGKILLed
    before it could stop its server (a SIGTERM drain cut short) once left one running, and its 100+ MB of files.
    The process's reaper stops it and removes them."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from agentrl.reaper import alive

    script = ("import time\nfrom agentrl.tasks.db.backends import MariaDBServer\n"
              "s = MariaDBServer().start()\nprint(s.proc.pid, s.dir, flush=True)\ntime.sleep(300)\n")
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[2])
    assert worker.stdout is not None
    pid, files = worker.stdout.readline().split()
    pid = int(pid)
    try:
        assert alive(pid) and Path(files).is_dir()
        worker.kill()
        worker.wait(timeout=30)
        deadline = time.monotonic() + 20
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(pid), "the worker's mariadbd outlived it"
        while Path(files).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not Path(files).exists(), "the server's files (over 100 MB) outlived it"
    finally:
        if alive(pid):
            os.killpg(pid, signal.SIGKILL)
        worker.kill()


def _rss_mb() -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS")).split()[1]) >> 10


def test_concurrent_sessions_share_no_server_state_and_give_back_their_memory() -> None:
    """On 8fd2eaf every session of a worker was a database on one server and a thread of
    the worker: session A modulated Com_select and B read it from SHOW GLOBAL STATUS (8 of 8 bits), GET_LOCK
    and UUID_SHORT() carried bits too, and 16 sessions reading 16 MB rows raised the worker's memory by
    695 MB, 410 MB of it held afterwards. Now each session is a process of its own (as the worker runs it:
    `isolation_of`) with a server of its own, both gone at its close."""
    import time

    from agentrl.reaper import alive
    from agentrl.serving.isolation import ProcessSession, SessionHost, isolation_of
    from agentrl.serving.session import ToolBox

    task = DbTask(backend="mariadb", statement_timeout_s=20.0)
    host = SessionHost({"db": (task, ToolBox(task.tools()))})

    def start(index: str) -> Any:  # as the worker would
        if isolation_of(task) == "process":
            return ProcessSession(host, task, index, 60.0, 60.0, 50.0)
        return Session(task, index)

    def sql(s: Any, query: str, i: int = 0) -> str:
        return str(s.interact(call("execute_sql", {"query": query}, f"c{i}")).messages[0]["content"])

    def servers() -> set[int]:
        return {int(p.name) for p in Path("/proc").iterdir()
                if p.name.isdigit() and f"--socket={tempfile_root()}" in _cmdline(p)}  # private servers

    before_servers = servers()
    rss = _rss_mb()
    a, b = start("train-0"), start("train-1")
    try:
        def selects() -> int:
            return int(sql(b, "SHOW GLOBAL STATUS LIKE 'Com_select'").split("'")[3])

        first = selects()
        for i in range(6):
            sql(a, "SELECT 1", i)
        assert sql(a, "SELECT GET_LOCK('agentrl', 0)") == "[(1,)]"
        assert selects() - first <= 1  # b's own statements only (a's 7 SELECTs on one server)
        assert sql(b, "SELECT IS_FREE_LOCK('agentrl')") == "[(1,)]"
        assert sql(b, "SELECT @@max_session_mem_used") == f"[({128 << 20},)]"
        for s in (a, b):
            assert sql(s, "SELECT LENGTH(REPEAT('x', 16e6)) FROM seq_1_to_3").startswith("[(16000000,)")
            sql(s, "SELECT REPEAT('x', 16e6) FROM seq_1_to_5")
        assert _rss_mb() - rss < 32, (rss, _rss_mb())  # no 16 MB row was read in this (the worker's) process
        assert len(servers() - before_servers) == 2  # one each
        for pid in servers() - before_servers:  # each server bounded as its session's process is (RLIMIT_AS)
            limits = Path(f"/proc/{pid}/limits").read_text()
            space = next(line.split()[3] for line in limits.splitlines() if line.startswith("Max address space"))
            assert space != "unlimited", limits
    finally:
        a.close()
        b.close()
        host.close()
    deadline = time.monotonic() + 20
    while servers() - before_servers and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not servers() - before_servers, "a session's server outlived it"
    assert not [pid for pid in servers() - before_servers if alive(pid)]


def _cmdline(p: Path) -> str:
    try:
        return (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def tempfile_root() -> str:
    import tempfile

    return str(Path(tempfile.gettempdir()) / "agentrl-mariadb-")
