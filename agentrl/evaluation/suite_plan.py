"""What `python -m jobs.eval_suite` plays, before it plays: the families, the modes, each family's limits and its
worst case, OUT's name and the files' stems, and the model's context, size and the scale line that says them.

    families   db dev and os dev (AgentBench's own samples, the faithful protocol; db on MariaDB), kg, alfworld
               and webshop test (this project's generated splits: Freebase, ALFWorld's games and WebShop's
               products are not here), BFCL multi_turn_base (its test split, 200 cases): `FAMILIES`
    settings   each task's own turn limit (faithful); max_new_tokens and the context from the model's config
               (preset or run) or flags; BFCL its own, longer context (`bfcl_context`): its first prompts alone
               are 3.5-3.8k tokens
    modes      greedy (temperature 0, one run) always; `sampled_runs` > 0 adds that many runs at the rollout's
               temperature
    bounds     before playing, each family's worst case in generated tokens (episodes x turns x max_new_tokens,
               and the context's cap on it): `FamilyPlan.worst_case`, `plan_lines`
    files      OUT/<family>/<stem>.jsonl (`stem_of`: jobs.eval's stem, so `jobs.eval ... --out OUT/<family>` would
               resume it too); OUT/<family>/<stem>.suite.json the wall time of each session that played it
               (`sessions_path`)
"""
from __future__ import annotations

import json
import math
import os
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.evaluation.runner import EvalScope, scope_keys
from agentrl.evaluation.targets import Target
from agentrl.monitor.eval_results import Key
from agentrl.rollout.agent_loop import EpisodeLimits
from agentrl.tasks.api import EnvError

BFCL_CONTEXT = 8192
"""BFCL's default context: its multi-turn cases' first prompts are 3.5-3.8k tokens (tools included) in
SmolLM2's format, over a 3,072-token context before the model says a word; a case plays 1-7 user turns."""
PAPER_SCALE = "the paper's models are 7B-32B (Qwen2.5-7B and -32B), trained and evaluated on GPUs"


@dataclass(frozen=True)
class Family:
    """One row of the suite: a task, its split and the task options that make it the paper's (or the nearest
    this machine has); `column` is the paper's (`eval_tables.AGENTBENCH_COLUMNS`), empty where the repository's
    table of paper numbers has none."""

    name: str
    split: str
    options: Mapping[str, Any] = field(default_factory=dict)
    column: str = ""
    concurrency: int = 0
    """At most this many of its episodes at once (0: the suite's `concurrency`)."""

    def at_once(self, suite_concurrency: int) -> int:
        return min(suite_concurrency, self.concurrency) if self.concurrency > 0 else suite_concurrency

    @property
    def data(self) -> str:
        """What the split is, in words."""
        if self.name == "bfcl":
            return f"BFCL {', '.join(self.options.get('categories', ['multi_turn_base']))} ({self.split}), " \
                   "bfcl-eval's checker"
        if self.options.get("source") == "agentbench":
            backend = f", {self.options['backend']}" if "backend" in self.options else ""
            return f"AgentBench-FC {self.split}{backend}"
        source = self.options.get("source", "ours")
        return f"generated {self.split}" + (f" ({MISSING[self.name]})" if self.name in MISSING else "") \
            if source == "ours" else f"{source} {self.split}"


MISSING = {"kg": "Freebase is out of reach", "alfworld": "ALFWorld's games are not here",
           "webshop": "WebShop's products are not here"}
"""Why a family plays this project's generated split rather than the paper's data."""

FAMILIES: tuple[Family, ...] = (
    # MariaDB sessions start slowly (a database, a user and the table each, in a session process): 12 at once on
    # 2 loaded cores took over the 25 s a session start may take, and 32 at once the worker missed its heartbeats;
    # 4 at once played the 60 dev samples in 92 s
    Family("db", "dev", {"source": "agentbench", "backend": "mariadb"}, "DB", concurrency=4),
    Family("os", "dev", {"source": "agentbench"}, "OS"),
    Family("kg", "test", {}, "KG"),
    Family("alfworld", "test", {}, "ALFWorld"),
    Family("webshop", "test", {}, "WebShop"),
    Family("bfcl", "test", {"categories": ["multi_turn_base"]}),
)
FAMILY_NAMES = tuple(f.name for f in FAMILIES)


@dataclass(frozen=True)
class Mode:
    name: str  # "greedy" | "sampled"
    temperature: float
    top_p: float
    runs: int


@dataclass(frozen=True)
class SuiteSpec:
    """What one suite plays: `families`, the first `samples` indices of each (0: whole splits), greedy plus
    `sampled_runs` sampled runs, at most `budget_s` of wall time (0: none), `concurrency` episodes at once
    across the suite (the engine's batch), every family and mode at the same time unless `sequential`."""

    families: tuple[Family, ...] = FAMILIES
    samples: int = 0
    sampled_runs: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    budget_s: float = 0.0
    concurrency: int = 32
    bfcl_context: int = BFCL_CONTEXT
    sequential: bool = False
    """One family and mode after another (a tight budget then completes families in order, rather than leaving
    each one partial); otherwise all at once, so that a family capped low (db) does not leave the engine idle."""

    @property
    def modes(self) -> tuple[Mode, ...]:
        greedy = Mode("greedy", 0.0, 1.0, 1)
        if self.sampled_runs <= 0:
            return (greedy,)
        return greedy, Mode("sampled", self.temperature, self.top_p, self.sampled_runs)


def family_options(families: Sequence[Family], overrides: Mapping[str, Mapping[str, Any]]
                   ) -> dict[str, dict[str, Any]]:
    """Each family's task options with the user's (`--task-option`) over the suite's."""
    return {f.name: {**f.options, **overrides.get(f.name, {})} for f in families}


def limits_of(family: Family, limits: EpisodeLimits, bfcl_context: int) -> EpisodeLimits:
    """A family's episode limits: each task's own turn limit (max_turns 0), the run's context, BFCL's longer one."""
    context = max(limits.max_model_len, bfcl_context) if family.name == "bfcl" else limits.max_model_len
    return EpisodeLimits(0, context, limits.max_new_tokens)


def model_context(model_dir: Path | None) -> int | None:
    """The model's own context (config.json's max_position_embeddings), where a local model says it."""
    if model_dir is None or not (model_dir / "config.json").exists():
        return None
    n = json.loads((model_dir / "config.json").read_text()).get("max_position_embeddings")
    return int(n) if isinstance(n, int) and n > 0 else None


def model_params(model_dir: Path | None) -> int | None:
    """Parameters in a model directory's safetensors files, from their headers (nothing loaded)."""
    if model_dir is None:
        return None
    total = 0
    for path in sorted(model_dir.glob("*.safetensors")):
        with path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        total += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    return total or None


def scale_line(target: Target, params: int | None, device: str) -> str:
    """What was evaluated where, beside the paper's scale."""
    if target.expert:
        return ("Scale: the tasks' scripted experts (no model): the ceiling of each env and its grader, not a "
                f"model's score; {PAPER_SCALE}.")
    if target.is_endpoint:
        return f"Scale: endpoint {target.base_url} (model {target.model}; its size and hardware are the server's); " \
               f"{PAPER_SCALE}."
    size = f"{params / 1e6:.0f}M parameters" if params else "a model of unknown size"
    return f"Scale: {target.label}, {size}, on {device}; {PAPER_SCALE}."


def device_line(target: Target, dtype: str) -> str:
    """Where a local model runs: the GPU torch sees, else this process's CPU cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if target.model_dir is not None:
        try:
            import torch

            if torch.cuda.is_available():
                return f"a {torch.cuda.get_device_name(0)} ({dtype}), {cores} CPU cores"
        except ImportError:
            pass
    return f"{cores} CPU cores (vLLM's CPU engine, {dtype})"


def out_name(target: Target) -> str:
    """The default OUT's name: runs/<this>-suite (the run dir's name, else the label)."""
    text = target.run_dir.name if target.run_dir is not None else target.label
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "model"


def stem_of(target: Target, family: Family, mode: Mode) -> str:
    """jobs.eval's stem for this family and mode: eval-<split>[-v<N>][-greedy]."""
    return f"eval-{family.split}" + (f"-v{target.version}" if target.version is not None else "") + \
        ("-greedy" if mode.temperature == 0 else "")


def sessions_path(results: Path) -> Path:
    return results.with_suffix(".suite.json")


@dataclass
class FamilyPlan:
    family: Family
    limits: EpisodeLimits
    keys: dict[str, list[Key]] = field(default_factory=dict)
    """Per mode, every episode to score."""
    max_turns: int | None = None
    """The task's own turn limit (what its first session said)."""
    error: str = ""

    def worst_case(self, mode: str) -> dict[str, int | None]:
        """Generated tokens at most: episodes x turns x max_new_tokens, and what each episode's context caps
        that at (its reply tokens cannot outgrow max_model_len)."""
        n = len(self.keys.get(mode, []))
        if self.max_turns is None:
            return {"episodes": n, "tokens": None, "context_capped": n * self.limits.max_model_len}
        per = self.max_turns * self.limits.max_new_tokens
        return {"episodes": n, "tokens": n * per, "context_capped": n * min(per, self.limits.max_model_len)}


async def plan(client: Any, spec: SuiteSpec, limits: EpisodeLimits) -> list[FamilyPlan]:
    """Each family's episodes per mode and its turn limit (its first session started and cancelled)."""
    plans = []
    for family in spec.families:
        p = FamilyPlan(family, limits_of(family, limits, spec.bfcl_context))
        try:
            for mode in spec.modes:
                scope = EvalScope((family.name,), family.split, spec.samples, mode.runs, spec.concurrency)
                p.keys[mode.name] = await scope_keys(client, scope)
            first = p.keys[spec.modes[0].name][0][2]
            start = await client.start_sample(family.name, first)
            await client.cancel(start.session_id)
            p.max_turns = start.max_turns
        except (EnvError, ValueError) as e:
            if not p.keys:
                p.error = f"{type(e).__name__}: {e}"
        plans.append(p)
    return plans


def plan_lines(plans: Sequence[FamilyPlan], spec: SuiteSpec) -> list[str]:
    """What each family may cost at most, before it is played."""
    lines = []
    for p in plans:
        if p.error:
            lines.append(f"  {p.family.name} {p.family.split}: cannot be played: {p.error}")
            continue
        for mode in spec.modes:
            w = p.worst_case(mode.name)
            tokens = f"{w['tokens']:,}" if w["tokens"] is not None else "?"
            lines.append(f"  {p.family.name} {p.family.split} {mode.name}: {w['episodes']} episodes x "
                         f"{p.max_turns if p.max_turns is not None else '?'} turns x {p.limits.max_new_tokens} "
                         f"new tokens = {tokens} generated tokens at most; each episode's {p.limits.max_model_len}-"
                         f"token context caps it at {w['context_capped']:,}")
    return lines
