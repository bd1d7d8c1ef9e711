"""jobs/bench_controller.py at a tiny size: real controller and worker processes, every session held,
interacted with and cancelled on both paths, no errors, and a report with the fields the issue asks for."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_tiny_benchmark_report(tmp_path: Path) -> None:
    out = tmp_path / "controller.json"
    subprocess.run([sys.executable, "-m", "jobs.bench_controller", "--sessions", "50", "--workers", "1",
                    "--duration", "0.6", "--slice", "0.3", "--rate", "100", "--concurrency", "8",
                    "--open-concurrency", "16", "--connections", "16", "--timeout", "90",
                    "--repeats", "3", "--run-dir", str(tmp_path / "run"), "--out", str(out)],
                   cwd=REPO, check=True, timeout=240, capture_output=True)
    r = json.loads(out.read_text())
    assert (r["sessions"], r["sessions_held"], r["sessions_held_direct"], r["errors"]) == (50, 50, 50, 0), r
    assert r["sessions_left"] == {"controller": 0, "workers": 0}
    assert r["touch"] == {"sessions": 50, "ms": r["touch"]["ms"], "missing": 0}
    for path in ("controller", "direct"):
        assert r[path]["errors"] == 0 and r[path]["rate"]["interactions"] == 60
        assert r[path]["saturate"]["interactions"] > 0 and r["interactions_per_s"][path] > 0
        lat = r["latency_ms_at_rate"][path]
        assert 0 < lat["p50"] <= lat["p99"] <= lat["max"]
    assert set(r["added_latency_ms"]) == {"rate", "saturate"} and "p99" in r["added_latency_ms"]["rate"]
    assert r["ratio"]["rate"]["p50"] > 0 and r["controller_overhead_ms"]["count"] > 0
    assert set(r["goal"]) == {"sessions_held_no_errors", "added_p99_under_2ms"} and r["goal"]["sessions_held_no_errors"]
    assert r["goal"]["added_p99_under_2ms"] in (True, False, None) and "goal_note" in r
    assert set(r["cpu_us_per_call"]) == {"controller", "workers", "client"}
    # three fresh repeats, each path's figures and the per-repeat ratios with their spread, and where it ran
    rep = r["repeats"]
    assert [len(rep["samples"][p]) for p in ("controller", "direct", "added")] == [3, 3, 3]
    p99 = rep["ratios"]["p99"]
    assert p99["min"] <= p99["median"] <= p99["max"] and len(p99["pairs"]) == 3
    shown = rep["samples"]["controller"][rep["shown"]]["p99_ms"]
    assert shown == r["latency_ms_at_rate"]["controller"]["p99"]
    assert r["machine"]["cpu_count"] >= 1 and len(r["machine"]["load_avg_before"]) == 3 and r["machine"]["command"]
