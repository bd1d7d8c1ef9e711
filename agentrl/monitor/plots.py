"""The run report's pictures (matplotlib, Agg; no pyplot, so nothing global changes and no display is
needed): per-task reward and success over steps, evaluation before/after with intervals, staleness,
throughput and idle fractions over time, and how episodes ended per task.

Each function draws one PNG and returns a `Plot` whose `series` is read back from the figure's own
artists (line data, bar heights, error-bar ends) after drawing, so a test can compare what was drawn with
the data it came from. A panel without data says so in the picture instead of being left out silently.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.monitor.eval_results import TaskResult
from agentrl.monitor.eval_stats import STATUSES, wilson_interval
from agentrl.monitor.run_data import RunData

STATUS_COLORS = {"completed": "#4c9a2a", "invalid_action": "#d95f02", "turn_limit": "#e6ab02",
                 "context_limit": "#a6761d", "truncated": "#7570b3", "grader_failed": "#1b9e77", "env_error": "#e7298a",
                 "cancelled": "#666666", "internal_error": "#000000"}


@dataclass
class Plot:
    """A written picture and what it shows: `series[f"{panel title}|{label}"]` holds x and y (and lo/hi
    for error bars) as drawn; `notes` the panels that had no data."""

    name: str
    path: Path
    series: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _figure(rows: int, cols: int = 1, width: float = 9.0, height: float = 3.2) -> Any:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height * rows), dpi=110, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, [ax for row in axes for ax in row]


def _empty(ax: Any, title: str, why: str, notes: list[str]) -> None:
    ax.set_title(title)
    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, color="#777777", wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])
    notes.append(f"{title}: {why}")


def drawn(fig: Any) -> dict[str, dict[str, list[Any]]]:
    """The numbers a figure shows, read from its artists: lines (x, y), bar containers (bar positions,
    lengths, and where an error bar is attached its low and high ends), and category tick labels."""
    from matplotlib.container import BarContainer

    out: dict[str, dict[str, list[Any]]] = {}
    for ax in fig.axes:
        title = ax.get_title()
        for ln in ax.get_lines():
            if not ln.get_label().startswith("_"):
                out[f"{title}|{ln.get_label()}"] = {"x": [float(v) for v in ln.get_xdata()],
                                                     "y": [float(v) for v in ln.get_ydata()]}
        for c in ax.containers:
            if not isinstance(c, BarContainer):
                continue
            horizontal = getattr(c, "orientation", "vertical") == "horizontal"
            rec: dict[str, list[Any]] = {
                "x": [float(r.get_y() + r.get_height() / 2 if horizontal else r.get_x() + r.get_width() / 2)
                      for r in c.patches],
                "y": [float(r.get_width() if horizontal else r.get_height()) for r in c.patches]}
            if c.errorbar is not None:
                segs = c.errorbar.lines[2][0].get_segments()
                rec["lo"] = [float(s[0][1]) for s in segs]
                rec["hi"] = [float(s[1][1]) for s in segs]
            out[f"{title}|{c.get_label()}"] = rec
        ticks = ax.get_yticklabels() if ax.get_ylabel() == "task" else ax.get_xticklabels()
        names = [t.get_text() for t in ticks if t.get_text()]
        if names and not all(_is_number(n) for n in names):
            out[f"{title}|ticks"] = {"labels": names}
    return out


def _is_number(text: str) -> bool:
    try:
        float(text.replace("\u2212", "-"))
        return True
    except ValueError:
        return False


def _save(fig: Any, name: str, out_dir: Path, notes: list[str]) -> Plot:
    path = out_dir / f"{name}.png"
    fig.savefig(path)
    return Plot(name, path, drawn(fig), notes)


def task_curves(run: RunData, out_dir: Path) -> Plot:
    """Per task: rollout reward and success over RL steps (rollout/<task>/{reward,success}), with the
    held-out evaluations (report/eval-v<N>.json greedy, eval_sampled-v<N>.json) as markers at version N
    (version N is the weights after N steps)."""
    fig, (ax_r, ax_s) = _figure(2)
    notes: list[str] = []
    tasks = run.tasks()
    for metric, ax in (("reward", ax_r), ("success", ax_s)):
        title = f"rollout {metric} per task"
        drew = False
        for task in tasks:
            s = run.scalars.get(f"rollout/{task}/{metric}")
            if s is not None and len(s.steps):
                (ln,) = ax.plot(s.steps, s.values, marker=".", label=task)
                drew = True
                if metric == "success":
                    for kind, mark in (("eval", "s"), ("eval_sampled", "D")):
                        points = sorted((v, b["per_task"][task]["success"]) for v, b in run.evals.get(kind, {}).items()
                                        if task in b.get("per_task", {}))
                        if points:
                            ax.plot(*zip(*points), mark, color=ln.get_color(), linestyle="none",
                                    label=f"{task} {'greedy' if kind == 'eval' else 'sampled'} eval (at version)")
        if drew:
            from matplotlib.ticker import MaxNLocator

            ax.set_title(title)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            if metric == "success":
                ax.set_ylim(-0.03, 1.03)
            ax.set_xlabel("RL step")
            ax.set_ylabel(metric)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8, loc="best")
        else:
            _empty(ax, title, f"no rollout/<task>/{metric} in tb/ yet", notes)
    return _save(fig, "task_curves", out_dir, notes)


def _eval_bars(ax: Any, tasks: Sequence[str], entries: Sequence[tuple[str, Mapping[str, tuple[float, float, float]]]],
               ylabel: str) -> None:
    """Grouped bars: for each entry (label, task -> (mean, lo, hi)) one bar per task with its interval."""
    width = 0.8 / max(len(entries), 1)
    x = np.arange(len(tasks), dtype=float)
    for i, (label, by_task) in enumerate(entries):
        rows = [by_task.get(t, (np.nan, np.nan, np.nan)) for t in tasks]  # a task this entry lacks: no bar
        means = [m for m, _, _ in rows]
        below = [m - lo for m, lo, _ in rows]  # error bars take distances from the bar's top
        above = [hi - m for m, _, hi in rows]
        bars = ax.bar(x + (i - (len(entries) - 1) / 2) * width, means, width, yerr=[below, above], capsize=3,
                      label=label)
        ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=2)  # a bar of height 0 is still read as 0.00
    ax.set_xticks(x, list(tasks))
    ax.set_ylim(0, 1.05)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="best")


def eval_interval(row: Mapping[str, Any]) -> tuple[float, float, float]:
    """(success, lo, hi) of one task's in-run evaluation (a `per_task` row of report/eval*-v<N>.json): the
    95% Wilson interval over its scored episodes, or no spread when the row does not say how many."""
    n = int(row.get("episodes", 0))
    if n <= 0:
        return row["success"], row["success"], row["success"]
    iv = wilson_interval(row["success"] * n, n)
    return iv.mean, iv.lo, iv.hi


def eval_before_after(run: RunData, out_dir: Path, results: Mapping[tuple[str, str], TaskResult] | None = None) -> Plot:
    """Held-out success per task at the first and the last evaluated version (greedy and sampled), with
    the 95% Wilson interval of a rate over the evaluation's episodes (`eval_interval`); and, when
    evaluation results files are given, their success per task and split with the t-interval over runs."""
    fig, axes = _figure(2 if results else 1)
    notes: list[str] = []
    tasks = run.tasks()
    entries = []
    for kind in ("eval", "eval_sampled"):
        versions = sorted(run.evals.get(kind, {}))
        for v in sorted({versions[0], versions[-1]}) if versions else []:
            per_task = run.evals[kind][v].get("per_task", {})
            entries.append((f"{'greedy' if kind == 'eval' else 'sampled'} v{v}",
                            {t: eval_interval(r) for t, r in per_task.items()}))
    title = "held-out success, first and last evaluation (95% Wilson interval)"
    if entries and tasks:
        axes[0].set_title(title)
        _eval_bars(axes[0], tasks, entries, "success")
    else:
        _empty(axes[0], title, "no report/eval*-v<N>.json yet", notes)
    if results:
        ax = axes[1]
        ax.set_title("evaluation results files (95% t-interval over runs)")
        rtasks = sorted({t for t, _ in results})
        by_split: dict[str, dict[str, tuple[float, float, float]]] = {}
        for (t, split), r in results.items():
            iv = r.success
            lo, hi = (iv.mean, iv.mean) if np.isnan(iv.lo) else (iv.lo, iv.hi)
            by_split.setdefault(split, {})[t] = (iv.mean, max(0.0, lo), min(1.0, hi))  # drawn within [0, 1]
        _eval_bars(ax, rtasks, sorted(by_split.items()), "success")
    return _save(fig, "eval_before_after", out_dir, notes)


def staleness(run: RunData, out_dir: Path) -> Plot:
    """Left: trajectories by staleness (versions the trainer was ahead of the oldest action token when it
    consumed them), summed over steps from pipeline/staleness_hist/<k>. Right: action tokens by how many
    versions each is behind the newest action token of its own trajectory (from the shards: the weight
    swaps an episode lived through, in-flight updates)."""
    fig, (ax_c, ax_t) = _figure(1, 2, width=11, height=3.6)
    notes: list[str] = []
    hist = {int(tag.rsplit("/", 1)[1]): float(s.values.sum()) for tag, s in run.scalars.items()
            if tag.startswith("pipeline/staleness_hist/") and tag.rsplit("/", 1)[1].lstrip("-").isdigit()}
    title_c = "trajectories by staleness when trained on"
    if hist:
        ks = sorted(hist)
        ax_c.set_title(title_c)
        ax_c.bar(ks, [hist[k] for k in ks], color="#1b9e77", label="trajectories")
        ax_c.set_xlabel("versions behind the trainer")
        ax_c.set_ylabel("trajectories")
        ax_c.set_xticks(ks)
    else:
        smax = run.scalars.get("pipeline/staleness_max")
        why = "no pipeline/staleness_hist/* in tb/ (the asynchronous trainer logs it)"
        if smax is not None and len(smax.values):
            why += f"; staleness_max over steps: {smax.values.max():g}"
        _empty(ax_c, title_c, why, notes)
    title_t = "action tokens by versions behind their trajectory's newest"
    lag = run.shards.token_lag
    if lag:
        ks = sorted(lag)
        ax_t.set_title(title_t)
        ax_t.bar(ks, [lag[k] for k in ks], color="#7570b3", label="tokens")
        ax_t.set_xlabel("versions behind")
        ax_t.set_ylabel("action tokens")
        ax_t.set_xticks(ks)
    else:
        _empty(ax_t, title_t, "no rollout trajectories in shards/ yet", notes)
    return _save(fig, "staleness", out_dir, notes)


THROUGHPUT_PANELS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("tokens per second", "tokens/s", ("pipeline/rollout_tokens_per_s", "pipeline/train_tokens_per_s")),
    ("trajectories per second", "trajectories/s", ("pipeline/trajectories_per_s",)),
    ("idle fraction", "fraction", ("pipeline/trainer_idle_frac", "pipeline/rollout_idle_frac",
                                   "pipeline/rollout_window_bound_frac")),
)


def throughput(run: RunData, out_dir: Path) -> Plot:
    """Throughput and idle fractions against wall-clock minutes since the run's first logged scalar (the
    trainer's and the rollout's steps are not the same clock; the wall clock is)."""
    fig, axes = _figure(len(THROUGHPUT_PANELS), height=2.6)
    notes: list[str] = []
    starts = [float(s.wall.min()) for s in run.scalars.values() if len(s.wall)]
    t0 = min(starts) if starts else 0.0
    for ax, (title, ylabel, tags) in zip(axes, THROUGHPUT_PANELS):
        present = [t for t in tags if t in run.scalars and len(run.scalars[t].steps)]
        if not present:
            _empty(ax, title, "not in tb/: " + ", ".join(tags), notes)
            continue
        ax.set_title(title)
        for tag in present:
            s = run.scalars[tag]
            ax.plot((s.wall - t0) / 60.0, s.values, marker=".", label=tag.removeprefix("pipeline/"))
        ax.set_ylabel(ylabel)
        ax.set_xlabel("minutes since the run's first metric")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    return _save(fig, "throughput", out_dir, notes)


def _fractions(counts: Mapping[str, float]) -> dict[str, float]:
    n = sum(counts.values())
    return {s: (counts.get(s, 0) / n if n else 0.0) for s in STATUSES}


def status_mix(run: RunData, out_dir: Path) -> Plot:
    """How episodes ended, per task: every rollout trajectory in the shards (without shards: the mean over
    steps of tb/ rollout/<task>/status/*), and the first and last held-out evaluation (greedy and sampled),
    as stacked fractions (env errors included, in their colour)."""
    rows: list[tuple[str, dict[str, float], int]] = []
    for task in run.tasks():
        if task in run.shards.status:
            c = run.shards.status[task]
            rows.append((f"{task} rollout", _fractions(c), sum(c.values())))
        elif tb := {s: run.scalars[f"rollout/{task}/status/{s}"] for s in STATUSES
                    if f"rollout/{task}/status/{s}" in run.scalars}:
            # No shards here (copied without them, or pruned): the per-step fractions, averaged over steps.
            steps = len({int(x) for series in tb.values() for x in series.steps})
            mean = {s: float(series.values.sum()) / steps for s, series in tb.items()}
            rows.append((f"{task} rollout, tb mean of {steps} steps", _fractions(mean), steps))
        for kind in ("eval", "eval_sampled"):
            versions = sorted(run.evals.get(kind, {}))
            for v in sorted({versions[0], versions[-1]}) if versions else []:
                c = run.evals[kind][v].get("per_task", {}).get(task, {}).get("status")
                if c:
                    rows.append((f"{task} {'greedy' if kind == 'eval' else 'sampled'} v{v}", _fractions(c),
                                 int(sum(c.values()))))
    fig, (ax,) = _figure(1, height=max(2.4, 0.38 * len(rows) + 1.4))
    notes: list[str] = []
    title = "how episodes ended"
    if not rows:
        _empty(ax, title, "no rollout shards and no evaluations yet", notes)
        return _save(fig, "status_mix", out_dir, notes)
    ax.set_title(title)
    y = np.arange(len(rows), dtype=float)
    left = np.zeros(len(rows))
    for s in STATUSES:
        w = np.array([r[1][s] for r in rows])
        if w.any():
            ax.barh(y, w, left=left, color=STATUS_COLORS[s], label=s)
            left += w
    ax.set_yticks(y, [f"{name} ({n})" for name, _, n in rows])
    ax.set_ylabel("task")
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("fraction of episodes (count in brackets)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(fig, "status_mix", out_dir, notes)


def pass_at_k_curves(results: Mapping[tuple[str, str], TaskResult], out_dir: Path) -> Plot:
    """pass@k against k per task and split, from evaluation results files (the unbiased estimator, for
    every k the results were aggregated with)."""
    fig, (ax,) = _figure(1, height=3.6)
    notes: list[str] = []
    title = "pass@k (unbiased estimator)"
    curves = {f"{t} {split}": r.pass_at_k for (t, split), r in results.items() if len(r.pass_at_k) > 1}
    if not curves:
        _empty(ax, title, "fewer than 2 samples per index: no curve", notes)
        return _save(fig, "pass_at_k", out_dir, notes)
    from matplotlib.ticker import MaxNLocator

    ax.set_title(title)
    for label, by_k in curves.items():
        ks = sorted(by_k)
        ax.plot(ks, [by_k[k] for k in ks], marker="o", label=label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k")
    ax.set_ylim(-0.03, 1.03)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _save(fig, "pass_at_k", out_dir, notes)
