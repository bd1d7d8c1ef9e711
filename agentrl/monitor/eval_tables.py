"""Evaluation results as tables: a terminal table, JSON, CSV, and a markdown table in AgentBench-FC's
layout (ALFWorld / DB / KG / OS / WebShop / Avg, success %) beside the paper's published numbers.

Input is what `eval_results.aggregate` returns; nothing here computes a statistic.
"""
from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.monitor.eval_results import TaskResult, average_over_tasks
from agentrl.monitor.eval_stats import STATUSES, Interval

# AgentBench-FC's columns, in its order: (our task name, the paper's column title).
AGENTBENCH_COLUMNS: tuple[tuple[str, str], ...] = (
    ("alfworld", "ALFWorld"), ("db", "DB"), ("kg", "KG"), ("os", "OS"), ("webshop", "WebShop"))

# Published AgentBench-FC test success (%), from the AgentRL paper (arXiv 2510.04206): ALFWorld, DB, KG,
# OS, WebShop, then the average the paper prints.
PUBLISHED: dict[str, tuple[float, float, float, float, float, float]] = {
    "AgentRL Qwen2.5-7B": (91.5, 63.7, 57.8, 40.8, 56.1, 62.0),
    "AgentRL Qwen2.5-32B": (94.5, 70.4, 77.0, 51.7, 58.6, 70.4),
    "GPT-5": (65.4, 63.2, 64.1, 34.5, 33.7, 52.2),
    "Claude-Sonnet-4": (73.6, 70.1, 63.4, 45.3, 34.6, 57.4),
    "Qwen2.5-14B-Instruct (prompting only)": (8.7, 48.4, 35.3, 26.0, 17.6, 27.2),
}


def _pct(iv: Interval) -> str:
    """`63.7 ± 1.2` in percent (± the interval's half width), or `63.7` when there is no spread."""
    if math.isnan(iv.lo):
        return f"{100 * iv.mean:.1f}"
    return f"{100 * iv.mean:.1f} ± {100 * iv.half_width:.1f}"


def terminal_table(results: Mapping[tuple[str, str], TaskResult]) -> str:
    """Aligned plain-text table: one row per task and split, then the average over tasks of each split."""
    ks = sorted({k for r in results.values() for k in r.pass_at_k})
    boot = any(r.bootstrap is not None for r in results.values())
    head = ["task", "split", "n", "runs", "success % (95% CI)", *(["bootstrap 95% CI"] if boot else []), "score",
            *[f"pass@{k}" for k in ks], "env_err %", "turns", "tokens", "wall s", "ended"]
    rows = []
    for r in results.values():
        ended = ", ".join(f"{s} {100 * v:.0f}%" for s, v in r.status.items() if v)
        b = r.bootstrap
        bcell = [f"[{100 * b.lo:.1f}, {100 * b.hi:.1f}]" if b is not None and not math.isnan(b.lo) else "-"] \
            if boot else []
        rows.append([r.task, r.split, str(r.samples), str(r.runs), _pct(r.success), *bcell, f"{r.score:.3f}",
                     *[f"{r.pass_at_k[k]:.3f}" if k in r.pass_at_k else "-" for k in ks],
                     f"{100 * r.env_error_rate:.1f}", f"{r.turns:.1f}", f"{r.tokens:.0f}", f"{r.wall_s:.1f}", ended])
    for split in sorted({r.split for r in results.values()}):
        of_split = [r for r in results.values() if r.split == split]
        if len(of_split) > 1:
            avg = average_over_tasks(of_split)
            rows.append(["average", split, "", "", _pct(avg), *([""] if boot else []), "", *[""] * len(ks),
                         "", "", "", "", ""])
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*head), fmt.format(*["-" * w for w in widths])]
    lines += [fmt.format(*row) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


def results_json(results: Mapping[tuple[str, str], TaskResult]) -> str:
    """Every task result plus the average over tasks per split, as indented JSON."""
    splits = sorted({r.split for r in results.values()})
    body: dict[str, Any] = {
        "tasks": [r.to_dict() for r in results.values()],
        "average": {s: average_over_tasks([r for r in results.values() if r.split == s]).to_dict() for s in splits},
    }
    return json.dumps(body, indent=2)


def results_csv(results: Mapping[tuple[str, str], TaskResult]) -> str:
    """One row per task and split; success as a fraction with its interval bounds (empty with one run)."""
    ks = sorted({k for r in results.values() for k in r.pass_at_k})
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["task", "split", "episodes", "samples", "runs", "success", "success_lo", "success_hi", "score",
                *[f"pass@{k}" for k in ks], *[f"status_{s}" for s in STATUSES], "turns", "tokens", "wall_s"])
    for r in results.values():
        iv = r.success
        w.writerow([r.task, r.split, r.episodes, r.samples, r.runs, f"{iv.mean:.6g}",
                    "" if math.isnan(iv.lo) else f"{iv.lo:.6g}", "" if math.isnan(iv.hi) else f"{iv.hi:.6g}",
                    f"{r.score:.6g}", *[f"{r.pass_at_k[k]:.6g}" if k in r.pass_at_k else "" for k in ks],
                    *[f"{r.status[s]:.6g}" for s in STATUSES], f"{r.turns:.6g}", f"{r.tokens:.6g}", f"{r.wall_s:.6g}"])
    return buf.getvalue()


def agentbench_markdown(results: Mapping[tuple[str, str], TaskResult], label: str, split: str = "test",
                        published: Mapping[str, Sequence[float]] = PUBLISHED) -> str:
    """A markdown table in AgentBench-FC's layout: our row (success %, ± the 95% half width over runs)
    first, then the paper's published rows. A task we did not evaluate shows `-`, and then our Avg is over
    the tasks present and says so (it is not comparable with the paper's five-task average)."""
    ours = {r.task: r for r in results.values() if r.split == split}
    cells = [_pct(ours[t].success) if t in ours else "-" for t, _ in AGENTBENCH_COLUMNS]
    present = [ours[t] for t, _ in AGENTBENCH_COLUMNS if t in ours]
    if present:
        avg = _pct(average_over_tasks(present))
        if len(present) < len(AGENTBENCH_COLUMNS):
            avg += f" ({len(present)} of {len(AGENTBENCH_COLUMNS)} tasks)"
    else:
        avg = "-"
    head = ["model", *[title for _, title in AGENTBENCH_COLUMNS], "Avg"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
             "| " + " | ".join([f"**{label}** (ours)", *cells, avg]) + " |"]
    for name, row in published.items():
        lines.append("| " + " | ".join([f"{name} (paper)", *[f"{x:.1f}" for x in row]]) + " |")
    return "\n".join(lines) + "\n"


def write_tables(results: Mapping[tuple[str, str], TaskResult], out_dir: str | Path, stem: str = "eval",
                 label: str = "this model") -> dict[str, Path]:
    """Write `<stem>.json`, `<stem>.csv`, `<stem>.md` (AgentBench-FC layout of the test split, then the
    full table) and `<stem>.txt` (the terminal table) into `out_dir`, each replaced atomically so a
    reader never sees half a table; returns the paths by format."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md = agentbench_markdown(results, label) if any(s == "test" for _, s in results) else ""
    bodies = {"json": results_json(results), "csv": results_csv(results), "txt": terminal_table(results) + "\n",
              "md": md + "\n```\n" + terminal_table(results) + "\n```\n"}
    paths = {}
    for ext, text in bodies.items():
        path = out / f"{stem}.{ext}"
        tmp = out / f".{stem}.{ext}.tmp"
        tmp.write_text(text)
        tmp.replace(path)
        paths[ext] = path
    return paths
