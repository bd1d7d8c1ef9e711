"""The run report a researcher reads in the morning: PNG plots and a markdown summary of one run dir
(config highlights, final numbers per task, the best checkpoint, wall time and where it went, what is
missing), for a finished run or one still in progress. `jobs/report.py` is its command line.

Reads through `run_data`, draws through `plots`; evaluation results files (`eval_results`) can be added.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.monitor import plots
from agentrl.monitor.balance import pipeline_bound
from agentrl.monitor.eval_results import TaskResult
from agentrl.monitor.eval_summary import status_mix as status_text
from agentrl.monitor.eval_tables import agentbench_markdown, terminal_table
from agentrl.monitor.run_data import RunData

# (label, dotted paths into config.yaml): what a reader needs to know to tell two runs apart. Several paths
# are joined with ", " when separated by "|", with " x " when separated by "*".
CONFIG_HIGHLIGHTS: tuple[tuple[str, str], ...] = (
    ("tasks", "envs.tasks"), ("model", "model.path"), ("schedule", "cluster.schedule"),
    ("RL steps", "trainer.steps"),
    ("groups per task x group size", "rollout.groups_per_task*rollout.group_size"),
    ("temperature", "rollout.temperature"), ("max turns", "rollout.max_turns"),
    ("max model len", "rollout.max_model_len"), ("lr", "trainer.lr"), ("warm-start steps", "trainer.warm_start_steps"),
    ("clip (low, high), dual clip", "algo.eps_low|algo.eps_high|algo.dual_clip"), ("KL coef", "algo.kl_coef"),
    ("task normalization", "algo.task_norm"), ("max staleness", "algo.max_staleness"),
    ("lagging prob (cross-policy)", "rollout.lagging_prob"), ("seed", "seed"),
)


@dataclass
class Report:
    markdown: str
    plots: list[plots.Plot] = field(default_factory=list)
    path: Path | None = None


def _get(cfg: Mapping[str, Any], dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def config_lines(cfg: Mapping[str, Any]) -> list[str]:
    rows = []
    for label, paths in CONFIG_HIGHLIGHTS:
        sep = " x " if "*" in paths else ", "
        values = [_get(cfg, p) for p in paths.replace("*", "|").split("|")]
        if all(v is None for v in values):
            continue
        if label == "model" and not values[0]:
            m = cfg.get("model", {})
            values = [f"built from scratch: hidden {m.get('hidden_size')}, {m.get('num_layers')} layers"]
        rows.append(f"| {label} | {sep.join(map(str, values))} |")
    return ["| setting | value |", "|---|---|", *rows] if rows else ["(no config.yaml)"]


def best_checkpoint(run: RunData) -> tuple[str, int, float] | None:
    """(kind, version, mean success over tasks) of the evaluated version that did best; sampled
    evaluations are preferred (they are what RL optimizes), a tie goes to the later version."""
    for kind in ("eval_sampled", "eval"):
        by_version = run.evals.get(kind, {})
        scored = []
        for v, body in by_version.items():
            per_task = body.get("per_task", {})
            if per_task:
                scored.append((sum(r["success"] for r in per_task.values()) / len(per_task), v))
        if scored:
            mean, v = max(scored)
            return kind, v, mean
    return None


def final_numbers(run: RunData) -> list[str]:
    """Per task: held-out success at the first and last evaluation, sampled and greedy (the last with its
    95% Wilson interval and episode count), the last rollout success logged, and how the last
    evaluation's episodes ended (env errors included: the in-run success counts them as failures, as
    jobs.eval does, and their count here says how much of a low number is the infrastructure's)."""
    lines = ["| task | greedy first → last [95% Wilson] | sampled first → last [95% Wilson] | last rollout success | "
             "last evaluation ended |", "|---|---|---|---|---|"]
    for task in run.tasks():
        cells = []
        ended = ""
        for kind in ("eval", "eval_sampled"):
            versions = sorted(run.evals.get(kind, {}))
            if not versions:
                cells.append("-")
                continue
            first = run.evals[kind][versions[0]].get("per_task", {}).get(task)
            last = run.evals[kind][versions[-1]].get("per_task", {}).get(task)
            if first is None or last is None:
                cells.append("-")
                continue
            _, lo, hi = plots.eval_interval(last)
            text = (f"{first['success']:.3f} (v{versions[0]}) → {last['success']:.3f} [{lo:.2f}, {hi:.2f}] "
                    f"(v{versions[-1]}, {last.get('episodes', '?')} ep.)")
            cells.append(text)
            ended = status_text(last.get("status", {}))
        s = run.scalars.get(f"rollout/{task}/success")
        cells.append(f"{s.values[-1]:.3f} (step {s.steps[-1]})" if s is not None and len(s.steps) else "-")
        lines.append(f"| {task} | " + " | ".join(cells) + f" | {ended or '-'} |")
    return lines


def _span(run: RunData, prefix: str) -> tuple[float, float] | None:
    walls = [w for tag, s in run.scalars.items() if tag.startswith(prefix) for w in s.wall.tolist()]
    return (min(walls), max(walls)) if walls else None


def wall_time_lines(run: RunData) -> list[str]:
    """The run's wall time and its phases, as far as the files tell: the warm start and RL as the span of
    their metrics' wall times, evaluations from eval*/seconds, the trainer's waits from
    pipeline/trainer_wait_s, the asynchronous trainer's fill and idle time from trainer.json."""
    lines = []
    total = (run.summary or {}).get("wall_s")
    everything = _span(run, "")
    if total is not None:
        lines.append(f"- wall time: {total:.0f} s (report/summary.json)")
    elif everything:
        lines.append(f"- so far: {everything[1] - everything[0]:.0f} s between the first and the last metric logged")
    for label, prefix in (("warm start (sft/* metrics)", "sft/"), ("RL (train/* metrics)", "train/")):
        if (sp := _span(run, prefix)) is not None:
            lines.append(f"- {label}: {sp[1] - sp[0]:.0f} s from first to last step logged")
    for kind, label in (("eval", "greedy evaluations"), ("eval_sampled", "sampled evaluations")):
        s = run.scalars.get(f"{kind}/seconds")
        if s is not None and len(s.values):
            each = ", ".join(f"v{st} {v:.0f} s" for st, v in zip(s.steps.tolist(), s.values.tolist()))
            lines.append(f"- {label}: {s.values.sum():.0f} s ({each})")
    w = run.scalars.get("pipeline/trainer_wait_s")
    if w is not None and len(w.values):
        lines.append(f"- trainer waiting for trajectories: {w.values.sum():.0f} s over {len(w.values)} steps "
                     f"(first step {w.values[0]:.0f} s: engines starting)")
    tr = run.trainer or {}
    for key, label in (("fill_s", "pipeline fill before the first batch"), ("idle_s", "trainer idle after it"),
                       ("rl_wall_s", "asynchronous RL wall")):
        if key in tr:
            lines.append(f"- {label}: {tr[key]:.0f} s (trainer.json)")
    idle, window = run.scalars.get("pipeline/trainer_idle_frac"), run.scalars.get("pipeline/rollout_window_bound_frac")
    if idle is not None and window is not None and len(idle.values) and len(window.values):
        i, w = float(idle.values[-1]), float(window.values[-1])
        lines.append(f"- balance (last logged): trainer idle {i:.2f}, rollout ranks at the staleness window {w:.2f} "
                     f"of their time: bound by the {pipeline_bound(i, w)}")
    return lines or ["- no timing in the run dir yet"]


def _progress(run: RunData) -> str:
    if run.finished:
        return "finished"
    tr = run.trainer or {}
    if "steps_done" in tr:
        return f"in progress: {tr['steps_done']} of {tr.get('steps', '?')} RL steps done (trainer.json)"
    s = run.scalars.get("train/loss")
    if s is not None and len(s.steps):
        return f"in progress: RL step {int(s.steps[-1]) + 1} logged"
    return "in progress: no RL step logged yet"


def render_markdown(run: RunData, drawn: Sequence[plots.Plot], results: Mapping[tuple[str, str], TaskResult] | None,
                    eval_label: str, out_dir: Path) -> str:
    name = run.config.get("name") or run.run_dir.name
    md = [f"# Run report: {name}", "", f"Run dir `{run.run_dir}`: {_progress(run)}.", "",
          "## Config highlights", "", *config_lines(run.config), "",
          "## Final numbers per task", "", *final_numbers(run), ""]
    best = best_checkpoint(run)
    md += ["## Best checkpoint", ""]
    if best is None:
        md.append("No evaluation yet.")
    else:
        kind, v, mean = best
        where = run.run_dir / "weights" / f"v{v}"
        md.append(f"`weights/v{v}`: mean {kind.replace('_', ' ')} success over tasks {mean:.3f} "
                  f"({'present' if where.is_dir() else 'not on disk any more'}).")
    if run.summary is not None:
        md.append(f"RL steps that changed the weights: {run.summary.get('rl_steps', '?')} of "
                  f"{run.summary.get('steps', '?')}.")
    md += ["", "## Wall time and where it went", "", *wall_time_lines(run), ""]
    if results:
        md += ["## Evaluation results", "", "```", terminal_table(results), "```", ""]
        if any(split == "test" for _, split in results):
            md += ["AgentBench-FC layout (test split, success %):", "", agentbench_markdown(results, eval_label), ""]
    md += ["## Plots", ""]
    for p in drawn:
        md.append(f"![{p.name}]({p.path.relative_to(out_dir).as_posix()})")
        md += [f"- {n}" for n in p.notes]
        md.append("")
    if run.missing:
        md += ["## Not (yet) in the run dir", "", *[f"- {m}" for m in run.missing], ""]
    return "\n".join(md)


def _nulls(node: Any) -> Any:
    """NaN (a bar with no data) as None, so series.json is strict JSON."""
    if isinstance(node, dict):
        return {k: _nulls(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_nulls(v) for v in node]
    return None if isinstance(node, float) and math.isnan(node) else node


def write_report(run: RunData, out_dir: Path, results: Mapping[tuple[str, str], TaskResult] | None = None,
                 eval_label: str = "this run") -> Report:
    """Draw every plot into `out_dir/plots/` (with `series.json`, the numbers each one drew) and write
    `out_dir/report.md`; returns both."""
    plot_dir = out_dir / "plots"
    plot_dir.mkdir(parents=True, exist_ok=True)
    drawn = [plots.task_curves(run, plot_dir), plots.eval_before_after(run, plot_dir, results),
             plots.staleness(run, plot_dir), plots.throughput(run, plot_dir), plots.status_mix(run, plot_dir)]
    if results:
        drawn.append(plots.pass_at_k_curves(results, plot_dir))
    series = {p.name: _nulls(p.series) for p in drawn}  # the numbers behind every picture, as drawn
    (plot_dir / "series.json").write_text(json.dumps(series, indent=1))
    text = render_markdown(run, drawn, results, eval_label, out_dir)
    path = out_dir / "report.md"
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(text)
    tmp.replace(path)  # a reader (or a second report of a live run) never sees half a file
    return Report(text, drawn, path)
