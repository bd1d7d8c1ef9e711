"""`jobs.demo_seeds --reuse` on finished runs reads them back (no training): the RL run, its seed's control and
the --ablate run, with the multi-task gates and the ablation reported beside its RL run but not gated."""
from __future__ import annotations

import json
from pathlib import Path

from tests.job_cli import run_job


def _summary(run_dir: Path, before: float, after: dict[str, float], episodes: int = 64) -> None:
    per_task = {task: {"success_before_rl": before, "success_after_rl": a, "sampled_success_before_rl": before,
                       "sampled_success_after_rl": a, "sampled_gain": a - before, "sampled_gain_stderr": 0.05,
                       "sampled_episodes": episodes} for task, a in after.items()}
    (run_dir / "report").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("name: x\n")
    (run_dir / "report" / "summary.json").write_text(json.dumps({"per_task": per_task, "wall_s": 5.0,
                                                                "trainer": {"sft_steps": 20}}))


def test_reuse_reads_the_rl_run_its_control_and_the_ablation_and_gates_only_the_first_two(tmp_path: Path) -> None:
    _summary(tmp_path / "s0-t2", 0.2, {"db": 0.6, "os": 0.5})
    _summary(tmp_path / "s0-t2-control", 0.2, {"db": 0.3, "os": 0.2})
    _summary(tmp_path / "s0-t2-ablate", 0.2, {"db": 0.9, "os": 0.1})  # a drop: reported, never a gate's miss
    out = tmp_path / "out.json"
    proc = run_job("demo_seeds", "--preset", "smoke", "--seeds", "0", "--threads", "2", "--control", "all",
                   "--gate-mean", "3", "--max-drop-sigmas", "2", "--ablate", "algo.task_norm=false",
                   "--root", str(tmp_path), "--out", str(out), "--reuse", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "s0-t2-ablate: reusing its finished run" in proc.stdout
    assert "s0-t2-ablate (algo.task_norm=false): mean over 2 tasks, RL - ablation +0.050" in proc.stdout
    assert "s0-t2: mean over 2 tasks, RL - control +0.300" in proc.stdout
    report = json.loads(out.read_text())
    assert [r["name"] for r in report["runs"]] == ["s0-t2", "s0-t2-control"] and report["misses"] == []
    (ablation,) = report["ablations"]
    assert ablation["vs_rl"]["os"]["diff"] == 0.5 - 0.1 and report["ablate"] == ["algo.task_norm=false"]
