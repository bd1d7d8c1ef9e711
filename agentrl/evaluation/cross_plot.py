"""The cross-sampling figure: pass@k against k per task, one line per arm (single A, single B, mix, cross)."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

STYLE = {"single A": ("tab:blue", "o"), "single B": ("tab:orange", "s"), "mix": ("tab:gray", "^"),
         "cross": ("tab:red", "D")}


def plot_curves(curves: Mapping[str, Mapping[str, list[float]]], path: str | Path, title: str = "") -> Path:
    """One panel per task; returns `path` (a PNG). matplotlib is imported here, headless."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(curves)
    fig, axes = plt.subplots(1, max(len(tasks), 1), figsize=(4.5 * max(len(tasks), 1), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for arm, values in curves[task].items():
            color, marker = STYLE.get(arm, ("black", "."))
            ax.plot(range(1, len(values) + 1), values, color=color, marker=marker, label=arm)
        ax.set(title=task, xlabel="k", ylabel="pass@k", ylim=(-0.02, 1.02))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
