"""What a run directory holds, read for the report (docs/architecture.md §8): TensorBoard scalars from tb/, trajectory
facts from the HDF5 shards, and the json files under report/. Every reader tolerates a run in progress:
a missing file or directory gives an empty result and a line in `RunData.missing` saying what was not
there, never an exception.

Reading only; `plots` draws and `report` writes.
"""
from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from agentrl.config import new_names
from agentrl.types import Trajectory

EVAL_NAME = re.compile(r"^(eval[a-z_]*)-v(\d+)\.json$")  # report/eval-v0.json, report/eval_sampled-v30.json


@dataclass
class Series:
    """One scalar tag over steps, in step order: step, value and the wall time it was logged at."""

    steps: np.ndarray  # int64[N]
    values: np.ndarray  # float64[N]
    wall: np.ndarray  # float64[N], seconds since the epoch


@dataclass
class ShardFacts:
    """Per-task counts from the rollout shards: how episodes ended, and how far behind the newest action
    token of its trajectory each action token was (the weight swaps an episode lived through)."""

    status: dict[str, Counter[str]] = field(default_factory=dict)  # task -> status -> episodes
    token_lag: Counter[int] = field(default_factory=Counter)  # versions behind the trajectory's newest -> tokens
    versions: Counter[int] = field(default_factory=Counter)  # policy version -> action tokens
    trajectories: int = 0


@dataclass
class RunData:
    run_dir: Path
    config: dict[str, Any]
    scalars: dict[str, Series]
    evals: dict[str, dict[int, dict[str, Any]]]  # "eval" / "eval_sampled" -> version -> file body
    summary: dict[str, Any] | None
    trainer: dict[str, Any] | None
    shards: ShardFacts
    missing: list[str]

    @property
    def finished(self) -> bool:
        """A run is finished once it wrote report/summary.json (the launcher's last act)."""
        return self.summary is not None

    def tasks(self) -> list[str]:
        """Tasks seen anywhere: the config, rollout/<task>/ tags, evaluations."""
        found = set(self.config.get("envs", {}).get("tasks", []) or [])
        found |= {t.split("/")[1] for t in self.scalars if t.startswith("rollout/") and t.count("/") >= 2}
        for by_version in self.evals.values():
            for body in by_version.values():
                found |= set(body.get("per_task", {}))
        return sorted(found)


def read_scalars(tb_dir: Path) -> dict[str, Series]:
    """Every scalar tag of every event file under `tb_dir`. A tag logged by two roles at the same step
    (rollout/<task>/* comes from the trainer and the rollout in the synchronous schedule) keeps the value
    of the event file that sorts first, so the result does not depend on read order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    merged: dict[str, dict[int, tuple[float, float]]] = defaultdict(dict)
    for path in sorted(p for p in tb_dir.rglob("events.out.tfevents.*") if p.is_file()):
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            for e in acc.Scalars(tag):
                merged[tag].setdefault(int(e.step), (float(e.value), float(e.wall_time)))
    out = {}
    for tag, by_step in sorted(merged.items()):
        steps = sorted(by_step)
        out[tag] = Series(np.array(steps, np.int64), np.array([by_step[s][0] for s in steps], np.float64),
                          np.array([by_step[s][1] for s in steps], np.float64))
    return out


def shard_facts(trajectories: Iterable[Trajectory]) -> ShardFacts:
    """Counts over the rollout's trajectories (the caller reads them from shards/rollout-*: monitor does not
    import transport, docs/architecture.md §2; expert demonstrations are not the policy's and are left out there)."""
    facts = ShardFacts()
    for t in trajectories:
        facts.trajectories += 1
        facts.status.setdefault(t.task, Counter())[t.status.value] += 1
        v = t.policy_version[t.loss_mask.astype(bool)]
        if len(v):
            facts.token_lag.update((int(v.max()) - v).tolist())
            facts.versions.update(v.tolist())
    return facts


def _json(path: Path, missing: list[str]) -> dict[str, Any] | None:
    if not path.is_file():
        missing.append(f"{path.name}: not written yet (the run is in progress or did not get that far)")
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:  # a file being written by a run without atomic writes
        missing.append(f"{path.name}: unreadable ({e})")
        return None


def load_run(run_dir: str | Path, trajectories: Iterable[Trajectory] = ()) -> RunData:
    """Everything the report shows, from what `run_dir` holds now; `trajectories` are the rollout's, read
    from its shards by the caller."""
    run_dir = Path(run_dir)
    missing: list[str] = []
    config: dict[str, Any] = {}
    if (run_dir / "config.yaml").is_file():
        # a run written before a key was renamed shows its highlights under the new names
        config = new_names(yaml.safe_load((run_dir / "config.yaml").read_text()) or {}, f"{run_dir}/config.yaml")
    else:
        missing.append("config.yaml: missing, so no config highlights")
    scalars: dict[str, Series] = {}
    if (run_dir / "tb").is_dir():
        scalars = read_scalars(run_dir / "tb")
    else:
        missing.append("tb/: missing, so no curves over steps")
    evals: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    report = run_dir / "report"
    for p in sorted(report.glob("eval*-v*.json")) if report.is_dir() else []:
        if m := EVAL_NAME.match(p.name):
            body = _json(p, missing)
            if body is not None:
                evals[m.group(1)][int(m.group(2))] = body
    if not evals:
        missing.append("report/eval*-v<N>.json: no evaluation yet")
    shards = shard_facts(trajectories)
    if not shards.trajectories:
        missing.append("shards/rollout-*: no rollout trajectories yet")
    return RunData(run_dir=run_dir, config=config, scalars=scalars, evals=dict(evals),
                   summary=_json(report / "summary.json", missing), trainer=_json(report / "trainer.json", missing),
                   shards=shards, missing=missing)
