"""The `db` task on SQLite: AgentBench-FC's interface, AgentBench's grading (by hand-computed cases and
on its dev subset, where every INSERT/UPDATE gold passes `answer_md5`), the expert, malformed calls,
what a statement may not do, and the committed data."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from env_helpers import call, expert_reward

from agentrl.serving.session import Session
from agentrl.tasks import get_task
from agentrl.tasks.db import TOOLS, DbTask, answers_match, clean_answers
from agentrl.tasks.db.backends import SqliteDatabase, Table, rows_hash
from agentrl.tasks.task_data import db_files
from agentrl.types import Status


@pytest.fixture(scope="module")
def task() -> DbTask:
    return DbTask()


def test_interface_is_agentbench_fc(task: DbTask) -> None:
    assert (task.name, task.max_turns, task.blocking) == ("db", 15, True)
    assert [t["function"]["name"] for t in TOOLS] == ["execute_sql", "commit_final_answer"]
    commit = TOOLS[1]["function"]["parameters"]
    assert commit == {"type": "object", "properties": {"answers": {
        "type": "array", "items": {"type": "string"}, "description": "The list of final answers to commit."}},
        "required": ["answers"], "additionalProperties": False}
    assert TOOLS[0]["function"]["parameters"]["required"] == ["query"]
    assert {split: len(task.indices(split)) for split in ("train", "test", "dev")} == {
        "train": 500, "test": 100, "dev": 60}


@pytest.mark.parametrize("answer, truth, kind, ok", [
    (["26"], ["26"], "other", True),
    (["2011"], ["2011.0"], "aggregation-SUM", True),  # numbers within 0.01
    (["19.504"], ["19.5"], "aggregation-AVG", True),
    (["19.52"], ["19.5"], "aggregation-AVG", False),
    (["1,234"], ["1234"], "other", True),  # thousands separators dropped
    (["45%"], ["45"], "other", True),
    ([], ["none"], "aggregation-MAX", False),
    (["NULL"], ["none"], "aggregation-MAX", True),  # none/null/"" all mean 0
    (["b", "a"], ["a", "b"], "comparison", True),  # several values: a set
    (["a", "a", "b"], ["a", "b"], "comparison", True),
    (["1", "2"], ["2.001", "1"], "comparison", True),  # all numbers: a multiset with tolerance
    (["1", "1"], ["1", "2"], "comparison", False),
    ("[('Giza',)]", ["Giza"], "ranking", True),  # a raw result string counts as its values
    (["'Giza'"], ["Giza"], "ranking", True),
    (["abc"], "[('abc',)]", "INSERT", True),
    (["abd"], "[('abc',)]", "UPDATE", False),
])
def test_answer_grading(answer: Any, truth: Any, kind: str, ok: bool) -> None:
    assert answers_match(answer, truth, kind) is ok


@pytest.mark.parametrize("answer, truth, ok", [
    (["Fantasy", "Fantasy"], ["Fantasy"], False),  # 1.0 on c07c523
    (["a", "a", "b"], ["a", "b"], False),
    (["b", "a"], ["a", "b"], True),
    (["John"], ["John", "John"], True),  # fewer copies than a label with duplicates: still its set
    (["1", "1"], ["1"], False),
])
def test_strict_grading_refuses_padded_answers(answer: Any, truth: Any, ok: bool) -> None:
    assert answers_match(answer, truth, "comparison", no_extra=True) is ok


def test_a_padded_answer_scores_nothing(task: DbTask) -> None:
    index, sample = next((i, s) for i, s in zip(task.indices("test"), task.split("test"))
                         if s.kind not in ("INSERT", "UPDATE", "DELETE") and len(clean_answers(s.label)) == 1)
    value = clean_answers(sample.label)[0]
    r = Session(task, index).interact(call("commit_final_answer", {"answers": [value, value]}))
    assert (r.done, r.reward) == (True, 0.0)
    r = Session(task, index).interact(call("commit_final_answer", {"answers": [value]}))
    assert (r.done, r.reward) == (True, 1.0)


def test_clean_answers() -> None:
    assert clean_answers(None) == ["0"]
    assert clean_answers("[('a',), ('b',)]") == ["a", "b"]
    assert clean_answers("['x', 3]") == ["x", "3"]
    assert clean_answers("[x, 'y, z']") == ["x", "y z"]  # not a literal: split outside quotes; commas dropped
    assert clean_answers(" 'q' ") == ["q"]


def test_table_hash_is_agentbench_formula() -> None:
    rows = [("a", "1"), ("b", None)]
    h = [hashlib.md5(b"a,1").hexdigest()[:5], hashlib.md5(b"b").hexdigest()[:5]]
    assert rows_hash(rows) == hashlib.md5(",".join(sorted(h)).encode()).hexdigest()
    assert rows_hash([]) == "None"
    many = [(str(i),) for i in range(400)]  # the joined row hashes are cut at 1024 bytes, like MySQL's GROUP_CONCAT
    joined = ",".join(sorted(hashlib.md5(str(i).encode()).hexdigest()[:5] for i in range(400)))
    assert rows_hash(many) == hashlib.md5(joined.encode()[:1024]).hexdigest()
    db = SqliteDatabase([Table("t", ("k", "v"), (("a", "1"), ("b", "2")))])
    assert db.table_hash([Table("t", ("k", "v"), ())]) == rows_hash([("a", "1"), ("b", "2")])
    db.execute("UPDATE t SET v = 9 WHERE k = 'b'")  # a number written into TEXT is stored as its text
    assert db.table_hash([Table("t", ("k", "v"), ())]) == rows_hash([("a", "1"), ("b", "9")])


def test_gold_sql_passes_answer_md5_on_dev(task: DbTask) -> None:
    """All 40 INSERT/UPDATE dev samples: AgentBench's gold SQL on SQLite gives AgentBench's answer_md5."""
    modify = [i for i, s in zip(task.indices("dev"), task.split("dev")) if s.kind in ("INSERT", "UPDATE")]
    assert len(modify) == 40
    assert sum(expert_reward(task, i) for i in modify) == 40
    session = Session(task, modify[0])  # committing without running the gold leaves the hash unchanged
    r = session.interact(call("commit_final_answer", {"answers": ["done"]}))
    assert (r.done, r.reward) == (True, 0.0)


def test_expert_on_our_samples(task: DbTask) -> None:
    indices = task.indices("train")[:40] + task.indices("test")[:16]  # every question type several times
    assert sum(expert_reward(task, i) for i in indices) == len(indices)
    kinds = {task.split("train")[i].kind.split("-")[0] for i in range(40)}
    assert kinds == {"other", "counting", "aggregation", "ranking", "comparison", "INSERT", "UPDATE", "DELETE"}


def test_observations_and_wrong_answers(task: DbTask) -> None:
    sample = task.split("train")[0]
    session = Session(task, "train-0")
    assert session.messages[1]["content"].startswith("Additional table information about the question: ")
    assert session.messages[1]["content"].endswith(f"Question: {sample.description}\n")
    r = session.interact(call("execute_sql", {"query": f"SELECT COUNT(*) FROM `{sample.tables[0].name}`"}))
    assert r.messages == [{"role": "tool", "tool_call_id": "c0", "name": "execute_sql",
                           "content": f"[({len(sample.tables[0].rows)},)]"}]
    r = session.interact(call("execute_sql", {"query": "SELEC 1"}, "c1"))
    assert r.messages[0]["content"].startswith("Error: near \"SELEC\"") and not r.done
    r = session.interact(call("execute_sql", {"query": "SELECT 1; SELECT 2"}, "c2"))
    assert r.messages[0]["content"].startswith("Error:") and "one statement" in r.messages[0]["content"]
    r = session.interact(call("execute_sql", {"query": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 "
                                                       "FROM c) SELECT x FROM c"}, "c3"))
    assert len(r.messages[0]["content"]) == 800 + len("[TRUNCATED]")  # the first rows, cut like AgentBench
    r = session.interact(call("commit_final_answer", {"answers": ["surely not this"]}, "c4"))
    assert (r.done, r.reward, r.status, r.metrics) == (True, 0.0, Status.COMPLETED, {"success": 0.0})


def test_statements_cannot_escape_or_run_forever(tmp_path: Path) -> None:
    db = SqliteDatabase([Table("t", ("a",), (("1",),))], timeout_s=0.5)
    out = db.execute(f"ATTACH DATABASE '{tmp_path / 'x.db'}' AS x")
    assert out.startswith("Error: not authorized") and not (tmp_path / "x.db").exists()
    assert db.execute("PRAGMA max_page_count = 999999999").startswith("Error: not authorized")
    out = db.execute("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c")
    assert out == "Error: the statement ran past 0.5 s"
    assert db.execute("SELECT a FROM t") == "[('1',)]"  # still usable afterwards


ROWS = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 10000) "


def test_results_and_temporary_storage_are_bounded() -> None:
    """On 5d8debb `SELECT zeroblob(16000000)` over 10,000 rows cost 86 MB of the worker per row
    before anything was cut, and a TEMP table wrote 1,175 MB to the host's disk in 11 s. Rows are now streamed
    only until the observation's 800 characters are full, a value is at most 1 MB, and TEMP lives in memory
    within 64 MB."""
    import resource

    db = SqliteDatabase([Table("t", ("a",), (("1",),))], timeout_s=5.0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = db.execute(ROWS.replace("10000", "200") + "SELECT zeroblob(1000000), x FROM c")
    assert out.startswith("[(b'\\x00\\x00") and out.endswith("[TRUNCATED]") and len(out) == 811
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 50 << 10  # KiB: not 200 rows of 1 MB
    assert db.execute("SELECT zeroblob(16000000)") == "Error: string or blob too big"
    assert db.execute("SELECT length(printf('%.*c', 2000000, 'x'))") == "[(None,)]"  # past the 1 MB bound
    out = db.execute("CREATE TEMP TABLE big AS " + ROWS + "SELECT randomblob(10000) FROM c")  # 100 MB
    assert out == "Error: database or disk is full"
    assert db.execute("SELECT count(*) FROM t") == "[(1,)]"
    rows = [(i, "x" * i, b"'y" * i) for i in range(120)]  # the streamed text is AgentBench's str(rows), cut
    db2 = SqliteDatabase([Table("r", ("a", "b", "c"), tuple((str(i), "x" * i, "'y" * i) for i in range(120)))])
    assert db2.execute("SELECT CAST(a AS INT), b, CAST(c AS BLOB) FROM r ORDER BY rowid") == str(rows)[:800] + "[TRUNCATED]"


def test_a_message_of_endless_statements_stops_at_its_budget() -> None:
    """Three endless CTEs in one message ran 3 x 10 s into the worker's deadline (env_error).
    Each statement now gets what is left of the message's budget."""
    import time

    from agentrl.tasks.api import message_budget

    db = SqliteDatabase([Table("t", ("a",), (("1",),))], timeout_s=10.0)
    endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c"
    t = time.monotonic()
    with message_budget(1.5):
        outs = [db.execute(endless) for _ in range(3)]
    assert time.monotonic() - t < 2.5
    assert outs[0].startswith("Error: the statement ran past 1.") and outs[2].startswith("Error: this message's time")


# Statements of process-wide effect, each played in a fresh interpreter (on c07c523 the third
# crashed it, and the fifth made every later SqliteDatabase of the process fail with MemoryError).
PROCESS_WIDE = ("SELECT hex(fts3_tokenizer('simple'))", "SELECT fts3_tokenizer('simple', x'4141414141414141')",
                "CREATE VIRTUAL TABLE v USING fts3(x, tokenize=simple)", "PRAGMA soft_heap_limit = 1",
                "PRAGMA hard_heap_limit = 1", "PRAGMA writable_schema = 1", "PRAGMA temp_store_directory = '/x'",
                "PRAGMA cache_size = -100000000", "SELECT load_extension('/lib/x86_64-linux-gnu/libc.so.6')")
PLAY = """
import sys
from agentrl.tasks.db.backends import SqliteDatabase, Table
db = SqliteDatabase([Table("t", ("a",), (("1",),))])
for sql in sys.argv[1:]:
    print(db.execute(sql), flush=True)
print(SqliteDatabase([Table("u", ("b",), (("2",),))]).execute("SELECT b FROM u"))
"""


def test_no_statement_acts_on_the_whole_process() -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", PLAY, *PROCESS_WIDE], capture_output=True, text=True, timeout=60,
                       cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    lines = r.stdout.splitlines()
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-2000:])
    assert len(lines) == len(PROCESS_WIDE) + 1 and lines[-1] == "[('2',)]", lines  # a later session still works
    assert all(line.startswith("Error: not authorized") for line in lines[:-1]), lines
    # introspection stays: AgentBench's agents read schemas
    db = SqliteDatabase([Table("t", ("a",), (("1",),))])
    assert db.execute("PRAGMA table_info(t)") == "[(0, 'a', 'TEXT', 0, None, 0)]"
    assert db.execute("SELECT name FROM pragma_table_list WHERE name = 't'") == "[('t',)]"


@pytest.mark.parametrize("message, expected", [
    (call("execute_sql", {"sql": "SELECT 1"}), "Error: invalid arguments for execute_sql: 'query' is a required"),
    (call("commit_final_answer", {"answers": "42"}), "Error: invalid arguments for commit_final_answer at answers"),
    (call("commit_final_answer", {"answers": [4]}), "Error: invalid arguments for commit_final_answer at answers/0"),
    (call("drop_table", {}), "Error: unknown tool 'drop_table'"),
])
def test_malformed_calls_are_observations(task: DbTask, message: dict[str, Any], expected: str) -> None:
    r = Session(task, "test-3").interact(message)
    assert not r.done and r.messages[0]["content"].startswith(expected), r.messages


def test_options_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTRL_AGENTBENCH_DIR", raising=False)
    for bad, match in (({"backend": "postgres"}, "unknown backend"), ({"sqlite_affinity": "x"}, "sqlite_affinity"),
                       ({"source": "agentbench"}, "needs agentbench_dir")):
        with pytest.raises(ValueError, match=match):
            get_task("db", **bad)


def test_committed_data_is_what_the_generator_makes() -> None:
    root = Path(__file__).resolve().parents[2] / "data"
    for rel, content in db_files().items():
        assert (root / rel).read_text() == content, rel
