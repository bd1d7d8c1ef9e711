"""agentrl.checks.expert_report: the scripted experts' success per task and split, and `jobs.expert_report`,
the command line that prints and writes it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.checks.expert_report import expert_reports, report_json, task_options

ROOT = Path(__file__).resolve().parents[2]


def test_task_options_parse() -> None:
    assert task_options(["db.backend=mariadb", "os.sandbox.command_timeout_s=2.5", "db.statement_timeout_s=3"]) == {
        "db": {"backend": "mariadb", "statement_timeout_s": 3}, "os": {"sandbox": {"command_timeout_s": 2.5}}}
    with pytest.raises(ValueError, match="task.option=value"):
        task_options(["backend=x"])


def test_expert_success_per_task_and_split() -> None:
    tasks = ["db", "os"] if shutil.which("bwrap") else ["db"]
    reports = list(expert_reports(tasks, ["train", "test", "nosuchsplit"], limit=8))
    got = {(r.task, r.split): (r.solved, r.episodes, r.errors) for r in reports}
    assert got[("db", "train")] == got[("db", "test")] == (8, 8, 0)
    if "os" in tasks:
        assert got[("os", "train")] == got[("os", "test")] == (8, 8, 0)
    assert not any(split == "nosuchsplit" for _, split in got)  # a split a task lacks is left out
    rows = report_json(["db.x=1"], reports)
    assert rows["options"] == ["db.x=1"]
    assert {(r["task"], r["split"], r["success"]) for r in rows["reports"]} >= {("db", "train", 1.0),
                                                                                 ("db", "test", 1.0)}


def test_the_command_prints_a_line_per_split_and_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "jobs.expert_report", "--tasks", "db", "--splits", "train,nosuchsplit",
                           "--limit", "4", "--option", "db.backend=sqlite", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[:5] == ["db", "train", "solved", "4/4", "="]
    rows = json.loads(out.read_text())
    assert rows["options"] == ["db.backend=sqlite"]
    assert [(r["task"], r["split"], r["episodes"], r["success"]) for r in rows["reports"]] == [("db", "train", 4, 1.0)]


def test_db_gold_replay_on_agentbench_dev_sqlite() -> None:
    """The measured gold pass rate of AgentBench's dev subset on SQLite: all 40 INSERT/UPDATE pass by
    answer_md5; 3 of the 20 SELECT-type samples' gold queries reproduce their labels."""
    (r,) = expert_reports(["db"], ["dev"])
    assert (r.solved, r.episodes, r.errors) == (43, 60, 0)
