"""Scored episodes: the resumable results file, aggregation per task (hand-computed), and the tables."""
from __future__ import annotations

import csv
import io
import json
import math

import pytest

from agentrl.monitor.eval_results import (
    ResultsFile,
    ScoredEpisode,
    aggregate,
    average_over_tasks,
    read_results,
)
from agentrl.monitor.eval_stats import pass_at_k, t_interval
from agentrl.monitor.eval_tables import (
    PUBLISHED,
    agentbench_markdown,
    results_csv,
    results_json,
    terminal_table,
    write_tables,
)


def ep(task: str, index: str, sample: int, success: float, status: str = "completed", split: str = "test",
       **kw) -> ScoredEpisode:
    return ScoredEpisode(task=task, split=split, index=index, sample=sample, success=success,
                         score=kw.pop("score", success), status=status, **kw)


# db: 2 indices x 4 runs. Index a succeeds in runs 0, 1, 2; index b only in run 0; run 3 of b is an env error.
DB = [ep("db", "a", s, 1.0 if s < 3 else 0.0, turns=2, tokens=100, wall_s=1.0) for s in range(4)] + \
     [ep("db", "b", s, 1.0 if s == 0 else 0.0, "env_error" if s == 3 else "turn_limit", turns=4, tokens=300,
         wall_s=3.0) for s in range(4)]
# os: 1 index x 4 runs, successes in runs 1 and 3.
OS = [ep("os", "x", s, float(s % 2)) for s in range(4)]


def test_aggregate_by_hand():
    res = aggregate(DB + OS, ks=(1, 2, 4, 8))
    db = res[("db", "test")]
    assert db.run_success == [1.0, 0.5, 0.5, 0.0]  # per run: mean over indices a, b
    assert db.success.mean == pytest.approx(0.5)
    assert db.success.half_width == pytest.approx(t_interval([1.0, 0.5, 0.5, 0.0]).half_width)
    assert db.pass_at_k[1] == pytest.approx((3 / 4 + 1 / 4) / 2)
    assert db.pass_at_k[2] == pytest.approx((pass_at_k(4, 3, 2) + pass_at_k(4, 1, 2)) / 2)
    assert 8 not in db.pass_at_k  # 4 samples per index cannot estimate pass@8
    assert db.status["env_error"] == pytest.approx(1 / 8) and db.env_error_rate == pytest.approx(1 / 8)
    assert db.status["turn_limit"] == pytest.approx(3 / 8) and db.status["completed"] == pytest.approx(0.5)
    assert db.episodes == 8 and db.samples == 2 and db.runs == 4
    assert (db.turns, db.tokens, db.wall_s) == pytest.approx((3.0, 200.0, 2.0))
    avg = average_over_tasks(list(res.values()))
    assert avg.mean == pytest.approx((0.5 + 0.5) / 2)
    # run r's average: db [1, .5, .5, 0] and os [0, 1, 0, 1] -> [.5, .75, .25, .5]
    assert avg.half_width == pytest.approx(t_interval([0.5, 0.75, 0.25, 0.5]).half_width)


def test_bootstrap_is_over_samples():
    res = aggregate(DB, bootstrap_resamples=200, seed=1)[("db", "test")]
    assert res.bootstrap is not None and res.bootstrap.mean == pytest.approx((0.75 + 0.25) / 2)
    assert "bootstrap" in res.to_dict()
    assert "bootstrap 95% CI" in terminal_table({("db", "test"): res})


def test_results_file_resumes_and_survives_a_cut_line(tmp_path):
    path = tmp_path / "report" / "eval-test.jsonl"
    with ResultsFile(path) as rf:
        assert rf.done == set()
        assert rf.append(DB[0]) and rf.append(DB[1])
        assert not rf.append(DB[0])  # already scored: skipped
    with open(path, "a") as f:  # a kill in the middle of a write
        f.write(DB[2].to_json()[:25])
    with ResultsFile(path) as rf:
        assert rf.done == {DB[0].key, DB[1].key}
        todo = [e for e in DB if e.key not in rf.done]
        assert len(todo) == 6
        for e in todo:
            rf.append(e)
    back = read_results(path)
    assert sorted(e.key for e in back) == sorted(e.key for e in DB)
    assert {e.key: e for e in back}[DB[4].key] == DB[4]
    lines = path.read_text().splitlines()
    assert len(lines) == 9 and sum(1 for x in lines if x.startswith("{") and x.endswith("}")) == 8


def test_tables():
    res = aggregate(DB + OS, ks=(1, 2))
    text = terminal_table(res)
    assert "50.0 ± " in text and "pass@2" in text and "average" in text and "env_error 12%" in text
    body = json.loads(results_json(res))
    assert body["tasks"][0]["task"] == "db" and body["tasks"][0]["env_error_rate"] == pytest.approx(0.125)
    assert body["average"]["test"]["mean"] == pytest.approx(0.5)
    rows = list(csv.DictReader(io.StringIO(results_csv(res))))
    assert [r["task"] for r in rows] == ["db", "os"]
    assert float(rows[0]["success"]) == pytest.approx(0.5) and float(rows[0]["status_env_error"]) == 0.125
    md = agentbench_markdown(res, "tiny")
    lines = md.splitlines()
    assert lines[0] == "| model | ALFWorld | DB | KG | OS | WebShop | Avg |"
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[0] == "**tiny** (ours)" and cells[1] == "-" and cells[2].startswith("50.0 ± ")
    assert cells[6].endswith("(2 of 5 tasks)")
    assert "| AgentRL Qwen2.5-7B (paper) | 91.5 | 63.7 | 57.8 | 40.8 | 56.1 | 62.0 |" in lines
    assert len(lines) == 3 + len(PUBLISHED)


def test_published_averages_match_their_rows():
    for name, row in PUBLISHED.items():  # the paper's Avg is the mean of its five columns (to rounding)
        assert abs(sum(row[:5]) / 5 - row[5]) < 0.15, name


def test_one_run_has_no_interval():
    res = aggregate([ep("kg", "q", 0, 1.0), ep("kg", "r", 0, 0.0)])[("kg", "test")]
    assert res.success.mean == 0.5 and math.isnan(res.success.lo)
    assert "50.0" in terminal_table({("kg", "test"): res})


def test_write_tables(tmp_path):
    res = aggregate(DB + OS, ks=(1, 2))
    paths = write_tables(res, tmp_path / "out", "eval-test", "tiny")
    assert sorted(paths) == ["csv", "json", "md", "txt"]
    assert json.loads(paths["json"].read_text()) == json.loads(results_json(res))
    assert paths["csv"].read_text() == results_csv(res)
    assert paths["md"].read_text().startswith(agentbench_markdown(res, "tiny"))
    assert not list((tmp_path / "out").glob(".*"))  # no temp file left
