"""AgentBench check: replay AgentBench's own gold answers through our tasks and classify every failure.

    python -m jobs.agentbench_check --agentbench ~/AgentBench --tasks os,db --split test
    python -m jobs.agentbench_check --agentbench ~/AgentBench --tasks db --backend mariadb --out check.json
    srun -n1 python -m jobs.agentbench_check --agentbench $AB --tasks db --backend mariadb --workers 8
    # submitit: executor.submit(jobs.agentbench_check.main, ["--agentbench", ab, "--tasks", "db"])

For each task and split it builds the task on the checkout (`source="agentbench"`, AgentBench-FC's
faithful protocol) and replays, through `Session` as the env worker would:
  * db: SELECT-type samples commit their label; INSERT/UPDATE/DELETE samples run their gold SQL, then
    commit (graded by the table hash);
  * os: the task's scripted expert (its example scripts), through the public Task API only.
Each failure is classified: "data defect" (the sample cannot pass in AgentBench-FC's own setup either,
with the evidence shown), "needs the network" (the sample installs or downloads), or "our defect"
(everything else: a difference of ours to fix). Prints one line per (task, split) and the failures with
their evidence; `--out` writes {task: {split: {passed, total, failures: {class: [ids]}}}} (plus the
evidence under "details").
"""
from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agentrl.envs.api import EnvError, Session, Task
from agentrl.envs.expert import play
from agentrl.envs.tasks import get_task
from agentrl.envs.tasks.db import MODIFY, DbSample, DbTask, answers_match
from agentrl.envs.tasks.shared import call_message
from agentrl.types import Status

log = logging.getLogger("agentrl.jobs.agentbench_check")

OURS, DATA, NETWORK = "our defect", "data defect", "needs the network"
NETWORK_COMMANDS = re.compile(r"\b(apt(-get)?|pip3?|curl|wget|git clone|npm|ping|nslookup|dig)\b")
STRICT_ERRORS = re.compile(r"^Error (1292|1265|1366|1264|1406|1048):")
"""MySQL errors that strict sql_mode raises where the non-strict mode only warns (truncated or
out-of-range values, bad conversions)."""

BAD_NAMES = re.compile(r"\((1166|1103|1059|1060),")
"""MySQL's errors for a table definition it refuses: incorrect column or table name, name too long,
duplicate column name."""

Outcome = tuple[bool, str, str]  # (passed, class, evidence)


# --------------------------------------------------------------------------------------------- db

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
    address = task.server_address()
    return f"unix:{address.unix_socket}" if address.unix_socket else f"{address.host}:{address.port}"


# --------------------------------------------------------------------------------------------- os

def replay_os(task: Task, index: str) -> Outcome:
    """The os task's scripted expert on one sample, through the public Task API."""
    reward, status, _ = play(task, index)
    if status == Status.COMPLETED and reward == 1.0:
        return True, "", ""
    text = _os_text(task, index)
    if NETWORK_COMMANDS.search(text):
        return False, NETWORK, f"status {status.value}; the sample's commands use the network"
    return False, OURS, f"status {status.value}, reward {reward}"


def _os_text(task: Task, index: str) -> str:
    """What the model sees of a sample and what its expert types (public API only)."""
    try:
        session = Session(task, index)
    except EnvError:
        return ""
    try:
        parts = [str(m.get("content") or "") for m in session.messages]
        parts += [json.dumps(session.expert_message())]
        return "\n".join(parts)
    except EnvError:
        return "\n".join(parts)
    finally:
        session.close()


# --------------------------------------------------------------------------------------------- main

def check(task: Task, split: str, replay: Any, limit: int | None, workers: int) -> dict[str, Any]:
    indices = task.indices(split)[:limit]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        outcomes = list(pool.map(lambda i: (i, *replay(task, i)), indices))
    failures: dict[str, list[str]] = {}
    details: dict[str, str] = {}
    for index, passed, kind, evidence in outcomes:
        if not passed:
            failures.setdefault(kind, []).append(index)
            details[index] = f"{kind}: {evidence}"
    return {"passed": sum(o[1] for o in outcomes), "total": len(outcomes), "failures": failures, "details": details}


def build(name: str, args: argparse.Namespace) -> tuple[Task, Any]:
    if name == "db":
        task: Task = DbTask(source="agentbench", agentbench_dir=args.agentbench, backend=args.backend)
        return task, replay_db
    if name == "os":
        return get_task("os", source="agentbench", agentbench_dir=args.agentbench), replay_os
    raise SystemExit(f"agentbench_check: no gold replay for task {name!r} (os, db)")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agentbench", required=True, help="an AgentBench checkout (THUDM/AgentBench, main)")
    parser.add_argument("--tasks", default="os,db")
    parser.add_argument("--split", default="test")
    parser.add_argument("--backend", default="sqlite", choices=("sqlite", "mariadb"), help="db's engine")
    parser.add_argument("--limit", type=int, default=None, help="first N samples of each split")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    report: dict[str, Any] = {}
    for name in [t.strip() for t in args.tasks.split(",") if t.strip()]:
        task: Task | None = None
        try:
            task, replay = build(name, args)
            result = check(task, args.split, replay, args.limit, args.workers)
        except (OSError, ValueError, KeyError, EnvError) as e:  # a checkout this task cannot read
            report[name] = {args.split: {"error": f"{type(e).__name__}: {e}"}}
            print(f"{name:8s} {args.split:6s} cannot run: {type(e).__name__}: {e}")
            continue
        finally:
            if callable(getattr(task, "close", None)):
                task.close()  # type: ignore[union-attr]
        report[name] = {args.split: result}
        counts = ", ".join(f"{k}: {len(v)}" for k, v in result["failures"].items()) or "no failures"
        print(f"{name:8s} {args.split:6s} {result['passed']}/{result['total']} passed ({counts})")
        for index, why in result["details"].items():
            print(f"    {index}: {why}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
