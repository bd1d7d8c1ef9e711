"""`db` on an AgentBench checkout in its real layout: one split loads without the others, AgentBench-FC's
faithful protocol (its prompt and tools read from the checkout, its argument handling and finish), our
strict protocol on request, and `agentrl.checks.replay` replaying the gold answers."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from agentbench_checkout import PROMPTS, build_checkout

from agentrl.checks.replay import run_checks
from agentrl.serving.session import Session
from agentrl.tasks.api import EnvError
from agentrl.tasks.db import DbTask
from agentrl.tasks.db.faithful import NO_CALLS, PARSE_ERROR, UNKNOWN_TOOL
from agentrl.types import Status


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_checkout(tmp_path_factory.mktemp("agentbench"))


@pytest.fixture(scope="module")
def task(checkout: Path) -> DbTask:
    return DbTask(source="agentbench", agentbench_dir=checkout)


def message(*calls: tuple[str, Any], content: str = "") -> dict[str, Any]:
    """An assistant message whose calls carry raw argument strings (or objects, JSON-encoded here)."""
    return {"role": "assistant", "content": content, "tool_calls": [
        {"id": f"c{i}", "type": "function",
         "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
        for i, (name, args) in enumerate(calls)]}


def first_select(task: DbTask, split: str = "test") -> int:
    return next(i for i, s in enumerate(task.split(split)) if s.kind not in ("INSERT", "UPDATE", "DELETE"))


def test_test_split_loads_without_the_train_file(task: DbTask, checkout: Path) -> None:
    assert not (checkout / "data/dbbench/db_out_new.jsonl").exists()
    assert len(task.indices("test")) == 60 and len(task.indices("dev")) == 60
    with pytest.raises(FileNotFoundError, match="db_out_new.jsonl"):
        task.indices("train")
    with pytest.raises(EnvError, match="no split"):
        task.indices("valid")


def test_faithful_is_the_default_and_reads_the_checkout(task: DbTask, checkout: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    assert task.protocol == "faithful" and task.max_turns == 15
    assert task.tools()[0]["function"]["name"] == "execute_sql"
    s = Session(task, f"test-{first_select(task)}")
    assert s.messages[0] == {"role": "system", "content": PROMPTS["db"]}
    assert s.messages[1]["content"].endswith(f"Question: {s.episode.sample.description}\n")
    assert DbTask(source="agentbench", agentbench_dir=checkout, protocol="strict").tools()[0]["function"][
        "description"] == "Executes a given SQL statement on the database and returns the result."
    with pytest.raises(ValueError, match="unknown protocol"):
        DbTask(source="agentbench", agentbench_dir=checkout, protocol="loose")
    monkeypatch.delenv("AGENTRL_AGENTBENCH_DIR", raising=False)
    with pytest.raises(ValueError, match="reads AgentBench-FC's prompt"):
        DbTask(protocol="faithful", agentbench_dir=None)


def test_faithful_argument_handling(task: DbTask) -> None:
    s = Session(task, f"test-{first_select(task)}")
    table = s.episode.sample.tables[0].name
    count = f"[({len(s.episode.sample.tables[0].rows)},)]"
    # every call runs, in order; the first argument counts whatever its key; no schema check
    r = s.interact(message(("execute_sql", {"sql": f"SELECT COUNT(*) FROM `{table}`"}),
                           ("execute_sql", "{not json"), ("drop_table", {"x": 1}),
                           ("execute_sql", {"query": 7})))
    assert [m["content"] for m in r.messages] == [
        count, PARSE_ERROR, UNKNOWN_TOOL, "Error executing query: the statement is a int, not a string"]
    assert [m["tool_call_id"] for m in r.messages] == ["c0", "c1", "c2", "c3"] and not r.done
    r = s.interact({"role": "assistant", "content": "The answer is 3."})  # no call: AgentBench's note, a round
    assert r.messages == [{"role": "user", "content": NO_CALLS}] and not r.done and s.turns == 2


def test_faithful_commit_ends_at_once_and_takes_any_answer(task: DbTask) -> None:
    i = first_select(task)
    label = task.split("test")[i].label
    s = Session(task, f"test-{i}")
    r = s.interact(message(("commit_final_answer", {"final": label}), ("execute_sql", {"query": "SELECT 1"})))
    assert (r.done, r.reward, r.status, r.messages) == (True, 1.0, Status.COMPLETED, [])  # later calls never ran
    s = Session(task, f"test-{i}")
    r = s.interact(message(("commit_final_answer", {"answers": "surely not this"})))  # a string, graded as such
    assert (r.done, r.reward, r.status) == (True, 0.0, Status.COMPLETED)
    s = Session(task, f"test-{i}")
    r = s.interact(message(("commit_final_answer", {})))  # AgentBench: TASK_ERROR, reward 0
    assert (r.done, r.reward, r.status) == (True, 0.0, Status.INVALID_ACTION)


def test_strict_protocol_stays_available(checkout: Path) -> None:
    task = DbTask(source="agentbench", agentbench_dir=checkout, protocol="strict")
    i = first_select(task)
    r = Session(task, f"test-{i}").interact(message(("execute_sql", {"sql": "SELECT 1"})))
    assert r.messages[0]["content"].startswith("Error: invalid arguments for execute_sql") and not r.done


def test_agentbench_check_replays_the_gold(checkout: Path, tmp_path: Path) -> None:
    report = run_checks(checkout, ["db"], "test")
    # the dev subset as the test split, on SQLite: every label passes its grader, every INSERT/UPDATE gold
    # reaches its answer_md5
    assert report["db"]["test"]["passed"] == report["db"]["test"]["total"] == 60
    assert report["db"]["test"]["failures"] == {}
    bad = run_checks(tmp_path / "nothing", ["db"])
    assert "error" in bad["db"]["test"]


@pytest.mark.skipif(not os.environ.get("AGENTRL_AGENTBENCH_DIR"), reason="no AgentBench checkout configured")
def test_a_real_checkout() -> None:
    """With a checkout of THUDM/AgentBench (main) in AGENTRL_AGENTBENCH_DIR: its prompt and 300 test samples."""
    task = DbTask(source="agentbench")
    s = Session(task, "test-0")
    assert s.messages[0]["content"].startswith("I will ask you a question") and len(task.indices("test")) == 300
