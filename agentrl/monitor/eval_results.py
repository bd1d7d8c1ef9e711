"""Scored evaluation episodes: the resumable results file, and their aggregation per task and split.

One scored episode is one line of a JSONL file, keyed by (task, split, index, sample): `sample` is the
run (0..k-1) the episode belongs to, so "the mean of k runs" is the mean over samples of each run's
success rate, and pass@k reads the k samples of one index. A re-run reads the file first and skips
keys already there (`ResultsFile.done`); every episode is appended as one whole line, flushed and
fsynced, so an interrupted evaluation (Ctrl-C, a killed job) leaves at worst a last line cut short,
which the reader ignores (and the next append starts on a fresh line).

The evaluation CLI writes these; `eval_tables` turns the aggregate into tables and the run report reads
the file (`python -m jobs.report RUN_DIR --eval FILE`).
"""
from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from agentrl.monitor.eval_stats import STATUSES, Interval, bootstrap_interval, mean_pass_at_k, status_rates, t_interval

Key = tuple[str, str, str, int]  # (task, split, index, sample)


@dataclass(frozen=True)
class ScoredEpisode:
    """One evaluated episode. `success` is the task's verdict; `score` AgentBench's score where it differs
    from success (else equal to it); `status` one of `eval_stats.STATUSES`."""

    task: str
    split: str
    index: str
    sample: int
    success: float
    score: float
    status: str
    turns: int = 0
    tokens: int = 0
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> Key:
        return (self.task, self.split, self.index, self.sample)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ScoredEpisode:
        return cls(task=str(d["task"]), split=str(d["split"]), index=str(d["index"]), sample=int(d["sample"]),
                   success=float(d["success"]), score=float(d.get("score", d["success"])), status=str(d["status"]),
                   turns=int(d.get("turns", 0)), tokens=int(d.get("tokens", 0)), wall_s=float(d.get("wall_s", 0.0)),
                   extra=dict(d.get("extra", {})))


def read_results(path: str | os.PathLike[str]) -> list[ScoredEpisode]:
    """Every complete line of a results file (a missing file is empty). A key scored twice (two runs
    that overlapped) keeps its first line; a last line cut short by a kill is skipped."""
    p = Path(path)
    if not p.exists():
        return []
    seen: dict[Key, ScoredEpisode] = {}
    for line in p.read_text().splitlines():
        if not line.strip():
            continue
        try:
            ep = ScoredEpisode.from_dict(json.loads(line))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue  # a partial line from an interrupted write
        seen.setdefault(ep.key, ep)
    return list(seen.values())


class ResultsFile:
    """Append-only JSONL of scored episodes that a re-run resumes from.

        with ResultsFile("runs/x/report/eval-test.jsonl") as rf:
            todo = [key for key in planned if key not in rf.done]
            for ep in evaluate(todo):
                rf.append(ep)      # one whole line, flushed and fsynced
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.episodes: list[ScoredEpisode] = read_results(self.path)
        self.done: set[Key] = {e.key for e in self.episodes}
        self._f: TextIO = open(self.path, "a", encoding="utf-8")  # closed in close()
        if self.path.stat().st_size and not self.path.read_bytes().endswith(b"\n"):
            self._f.write("\n")  # a line cut short by a kill stays alone on its line

    def append(self, ep: ScoredEpisode) -> bool:
        """Write `ep` unless its key is already scored; returns whether it was written."""
        if ep.key in self.done:
            return False
        self._f.write(ep.to_json() + "\n")  # one write of a whole line
        self._f.flush()
        os.fsync(self._f.fileno())
        self.done.add(ep.key)
        self.episodes.append(ep)
        return True

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> ResultsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class TaskResult:
    """One task and split, aggregated. `success` is the mean over runs of each run's success rate, with a
    t-interval over runs (`bootstrap`: over samples, when asked for); env errors count as failures here and
    are reported again as `status["env_error"]`."""

    task: str
    split: str
    episodes: int
    samples: int
    runs: int
    success: Interval
    score: float
    pass_at_k: dict[int, float]
    status: dict[str, float]
    turns: float
    tokens: float
    wall_s: float
    run_success: list[float]
    bootstrap: Interval | None = None

    @property
    def env_error_rate(self) -> float:
        return self.status["env_error"]

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "task": self.task, "split": self.split, "episodes": self.episodes, "samples": self.samples,
            "runs": self.runs, "success": self.success.to_dict(), "score": self.score,
            "pass_at_k": {str(k): v for k, v in self.pass_at_k.items()}, "status": self.status,
            "env_error_rate": self.env_error_rate, "turns": self.turns, "tokens": self.tokens,
            "wall_s": self.wall_s, "run_success": self.run_success,
        }
        if self.bootstrap is not None:
            d["bootstrap"] = self.bootstrap.to_dict()
        return d


def aggregate_task(episodes: Sequence[ScoredEpisode], ks: Iterable[int] = (1,), confidence: float = 0.95,
                   bootstrap_resamples: int = 0, seed: int = 0) -> TaskResult:
    """Aggregate the episodes of one (task, split). pass@k is given for each k in `ks` that every index
    has at least k samples for (an index with fewer cannot estimate it); runs are the distinct `sample`
    ids, each run's success rate averaged over the indices it holds."""
    if not episodes:
        raise ValueError("no episodes to aggregate")
    task, split = episodes[0].task, episodes[0].split
    if any((e.task, e.split) != (task, split) for e in episodes):
        raise ValueError("aggregate_task takes the episodes of one task and split")
    by_run: dict[int, list[float]] = defaultdict(list)
    by_index: dict[str, list[float]] = defaultdict(list)
    for e in episodes:
        ok = 1.0 if e.success > 0.5 else 0.0  # success is a verdict; a partial score goes to `score`
        by_run[e.sample].append(ok)
        by_index[e.index].append(ok)
    run_success = [float(np.mean(v)) for _, v in sorted(by_run.items())]
    counts = [(len(v), int(sum(v))) for v in by_index.values()]
    fewest = min(n for n, _ in counts)
    boot = None
    if bootstrap_resamples > 0:
        per_index = [float(np.mean(v)) for _, v in sorted(by_index.items())]
        boot = bootstrap_interval(per_index, confidence, bootstrap_resamples, seed)
    return TaskResult(
        task=task, split=split, episodes=len(episodes), samples=len(by_index), runs=len(by_run),
        success=t_interval(run_success, confidence), score=float(np.mean([e.score for e in episodes])),
        pass_at_k={k: mean_pass_at_k(counts, k) for k in sorted(set(ks)) if k <= fewest},
        status=status_rates(e.status for e in episodes),
        turns=float(np.mean([e.turns for e in episodes])), tokens=float(np.mean([e.tokens for e in episodes])),
        wall_s=float(np.mean([e.wall_s for e in episodes])), run_success=run_success, bootstrap=boot,
    )


def aggregate(episodes: Iterable[ScoredEpisode], ks: Iterable[int] = (1,), confidence: float = 0.95,
              bootstrap_resamples: int = 0, seed: int = 0) -> dict[tuple[str, str], TaskResult]:
    """`aggregate_task` for every (task, split) present, sorted by task then split."""
    groups: dict[tuple[str, str], list[ScoredEpisode]] = defaultdict(list)
    for e in episodes:
        groups[(e.task, e.split)].append(e)
    ks = tuple(ks)
    return {key: aggregate_task(groups[key], ks, confidence, bootstrap_resamples, seed) for key in sorted(groups)}


def average_over_tasks(results: Sequence[TaskResult], confidence: float = 0.95) -> Interval:
    """The average over tasks (each task weighs the same, as AgentBench's Avg column), with a t-interval
    over runs: run r's average is the mean over tasks of each task's run-r success. Only runs every task
    has enter the interval (the mean is the mean of the per-task means either way)."""
    if not results:
        raise ValueError("an average of no tasks")
    mean = float(np.mean([r.success.mean for r in results]))
    common = min(len(r.run_success) for r in results)
    if common < 2:
        return Interval(mean, math.nan, math.nan, common, confidence)
    per_run = np.mean([r.run_success[:common] for r in results], axis=0)  # [runs]
    iv = t_interval(per_run.tolist(), confidence)
    # Centre on the mean of every run's data; the spread is the common runs' (equal when all have as many).
    return Interval(mean, mean - iv.half_width, mean + iv.half_width, common, confidence)


__all__ = ["STATUSES", "Key", "ResultsFile", "ScoredEpisode", "TaskResult", "aggregate", "aggregate_task",
           "average_over_tasks", "read_results"]
