"""One model on the paper's evaluation families, whole splits, one table (`python -m jobs.eval_suite`).

    families   db dev and os dev (AgentBench's own samples, the faithful protocol; db on MariaDB), kg, alfworld
               and webshop test (this project's generated splits: Freebase, ALFWorld's games and WebShop's
               products are not here), BFCL multi_turn_base (its test split, 200 cases): `FAMILIES`
    settings   each task's own turn limit (faithful); max_new_tokens and the context from the model's config
               (preset or run) or flags; BFCL its own, longer context (`bfcl_context`): its first prompts alone
               are 3.5-3.8k tokens
    modes      greedy (temperature 0, one run) always; `sampled_runs` > 0 adds that many runs at the rollout's
               temperature
    bounds     before playing, each family's worst case in generated tokens (episodes x turns x max_new_tokens,
               and the context's cap on it); after, its measured wall time; a budget in wall time stops the
               suite cleanly: the episodes left are counted as unfinished (never as failures, never dropped) and
               the table says it is partial
    files      OUT/<family>/<stem>.jsonl: jobs.eval's results file, transcripts and tables (the same stem and
               fingerprint, so the same command resumes it and `jobs.eval ... --out OUT/<family>` would too);
               OUT/<family>/<stem>.suite.json the wall time of each session that played it; OUT/suite.{json,md}
               the table (`summarize`), the model's rows beside the paper's

Success per family is over the episodes scored, with the Wilson 95% interval (`eval_stats.wilson_interval`, as
the run report draws it) and the binomial standard error; env errors count as failures and are reported.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import shutil
import struct
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agentrl.evaluation.evaluate import (
    Settings,
    chat_policy,
    check_fit,
    check_resumable,
    load_format,
    local_model,
    score_into,
    tables,
)
from agentrl.evaluation.players import EndpointPlayer, ExpertPlayer, LocalPlayer
from agentrl.evaluation.runner import EvalScope, scope_keys
from agentrl.evaluation.targets import Target
from agentrl.monitor.eval_results import Key, ResultsFile, aggregate_task, read_results
from agentrl.monitor.eval_stats import STATUSES, wilson_interval
from agentrl.monitor.eval_tables import AGENTBENCH_COLUMNS, PUBLISHED
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
    `sampled_runs` sampled runs, at most `budget_s` of wall time (0: none), `concurrency` episodes at once."""

    families: tuple[Family, ...] = FAMILIES
    samples: int = 0
    sampled_runs: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    budget_s: float = 0.0
    concurrency: int = 32
    bfcl_context: int = BFCL_CONTEXT

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


def out_name(target: Target) -> str:
    """The default OUT's name: runs/<this>-suite (the run dir's name, else the label)."""
    text = target.run_dir.name if target.run_dir is not None else target.label
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "model"


def stem_of(target: Target, family: Family, mode: Mode) -> str:
    """jobs.eval's stem for this family and mode: eval-<split>[-v<N>][-greedy]."""
    return f"eval-{family.split}" + (f"-v{target.version}" if target.version is not None else "") + \
        ("-greedy" if mode.temperature == 0 else "")


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


class Players:
    """The players of one target, one per family and mode (their own limits and sampling), sharing one engine
    (a local model, loaded at the first family that needs it, with the longest context of the suite) or one
    endpoint; `engine_s` is what loading it took."""

    def __init__(self, stack: contextlib.AsyncExitStack, client: Any, target: Target, settings: Settings,
                 concurrency: int, engine_len: int) -> None:
        self.stack, self.client, self.target, self.settings = stack, client, target, settings
        self.concurrency, self.engine_len = concurrency, engine_len
        self._shared: Any = None
        self.engine_s = 0.0

    async def _open(self) -> Any:
        if self._shared is None:
            t0 = time.monotonic()
            wide = replace(self.settings, limits=replace(self.settings.limits, max_model_len=self.engine_len))
            if self.target.is_endpoint:
                self._shared = await self.stack.enter_async_context(chat_policy(self.target, wide, self.concurrency))
            else:
                self._shared = await self.stack.enter_async_context(local_model(self.target, wide, self.concurrency))
            self.engine_s = time.monotonic() - t0
        return self._shared

    async def player(self, settings: Settings, scope: EvalScope) -> Any:
        """A player under `settings` (a family's limits, a mode's sampling); a local model's first prompts must
        fit its context (`check_fit`, ValueError otherwise)."""
        if self.target.expert:
            return ExpertPlayer(self.client, settings.limits, settings.retry)
        if self.target.is_endpoint:
            return EndpointPlayer(self.client, await self._open(), settings.temperature, settings.top_p,
                                  settings.limits, settings.retry)
        from agentrl.rollout.engine import SamplingConfig

        await check_fit(self.client, load_format(self.target, settings), scope, settings)
        engine, fmt = await self._open()
        sampling = SamplingConfig(settings.limits.max_new_tokens, settings.temperature, settings.top_p, fmt.stop_ids)
        return LocalPlayer(self.client, engine, fmt, sampling, settings.limits, settings.retry)


def sessions_path(results: Path) -> Path:
    return results.with_suffix(".suite.json")


def record_session(results: Path, entry: dict[str, Any]) -> None:
    """Add one session's wall time to OUT/<family>/<stem>.suite.json."""
    path = sessions_path(results)
    old = json.loads(path.read_text()) if path.exists() else {"sessions": []}
    old["sessions"].append(entry)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(old, indent=2))
    tmp.replace(path)


async def run_suite(client: Any, target: Target, spec: SuiteSpec, settings: Settings, out: Path,
                    plans: Sequence[FamilyPlan], progress: bool | None = None, say: Callable[[str], None] = print,
                    started: float | None = None) -> dict[str, Any]:
    """Play every family and mode of `plans` not yet scored into OUT/<family>/, within the budget from `started`
    (time.monotonic()); returns what the run did (`engine_s`, `stopped`: the budget ran out)."""
    t_start = time.monotonic() if started is None else started
    deadline = t_start + spec.budget_s if spec.budget_s > 0 else math.inf
    done_run: dict[str, Any] = {"engine_s": 0.0, "stopped": ""}
    engine_len = max([p.limits.max_model_len for p in plans if not p.error] or [settings.limits.max_model_len])
    rates = [0.0, 0.0]  # tokens generated and seconds spent scoring, by this command: the estimate's rate
    async with contextlib.AsyncExitStack() as stack:
        players = Players(stack, client, target, settings, spec.concurrency, engine_len)
        for p in plans:
            if p.error:
                continue
            fdir = out / p.family.name
            for mode in spec.modes:
                keys = p.keys[mode.name]
                keyset = set(keys)
                path = fdir / f"{stem_of(target, p.family, mode)}.jsonl"
                done = {e.key for e in read_results(path)} & keyset
                s = replace(settings, temperature=mode.temperature, top_p=mode.top_p, limits=p.limits)
                at_once = p.family.at_once(spec.concurrency)
                scope = EvalScope((p.family.name,), p.family.split, spec.samples, mode.runs, at_once)
                fingerprint = s.fingerprint(scope, [target])
                if len(done) == len(keyset):
                    check_resumable(path.with_suffix(".meta.json"), fingerprint)
                    say(f"{p.family.name} {mode.name}: all {len(keys)} episodes already scored in {path}")
                    continue
                if time.monotonic() >= deadline:
                    done_run["stopped"] = done_run["stopped"] or f"{p.family.name} {mode.name}"
                    say(f"{p.family.name} {mode.name}: not started, the budget is spent")
                    continue
                try:
                    player = await players.player(s, scope)
                except ValueError as e:  # a context that cannot hold the first prompts
                    p.error = str(e)
                    say(f"{p.family.name}: cannot be played: {e}")
                    break
                done_run["engine_s"] = players.engine_s
                left = len(keys) - len(done)
                worst = p.worst_case(mode.name)["context_capped"] * left // max(1, len(keys))
                rate = rates[0] / rates[1] if rates[1] > 0 and rates[0] > 0 else 0.0
                say(f"{p.family.name} {mode.name}: scoring {left} of {len(keys)} episodes into {path}"
                    + (f"; at the {rate:.0f} tokens/s this command measured so far, its {worst:,} tokens at most "
                       f"would take {worst / rate / 60:.0f} min" if rate else ""))
                t0, wall_t0 = time.monotonic(), time.time()
                stopped = ""
                try:
                    async with asyncio.timeout(None if math.isinf(deadline) else
                                               max(0.0, deadline - time.monotonic())) as cm:
                        await score_into(player, keys, path, fingerprint, at_once, progress)
                except TimeoutError:
                    if not cm.expired():
                        raise
                    stopped = "budget"
                    done_run["stopped"] = done_run["stopped"] or f"{p.family.name} {mode.name}"
                    say(f"{p.family.name} {mode.name}: the budget is spent; the episodes left are unfinished")
                except BaseException:
                    stopped = "error or signal"
                    raise
                finally:  # each session's wall time, however it ended
                    now = [e for e in read_results(path) if e.key in keyset and e.key not in done]
                    scored = len(now)
                    rates[0] += sum(e.tokens for e in now)
                    rates[1] += time.monotonic() - t0
                    record_session(path, {"started": wall_t0, "wall_s": round(time.monotonic() - t0, 3),
                                          "scored": scored, "stopped": stopped})
                if not stopped:
                    with ResultsFile(path) as rf:
                        tables(rf, keys, fdir, path.stem, target.label)
    return done_run


def _rate(successes: int, n: int) -> dict[str, Any]:
    if n == 0:
        return {"success": None, "stderr": None, "wilson": None}
    p = successes / n
    iv = wilson_interval(successes, n)
    return {"success": p, "stderr": math.sqrt(p * (1 - p) / n), "wilson": [iv.lo, iv.hi]}


def mode_result(target: Target, plan_: FamilyPlan, mode: Mode, out: Path) -> dict[str, Any]:
    """One family and mode from its files: success over the episodes scored (Wilson 95%, binomial s.e.), the
    unfinished ones counted beside them with the range they leave, statuses, tokens and measured wall time."""
    path = out / plan_.family.name / f"{stem_of(target, plan_.family, mode)}.jsonl"
    keys = plan_.keys.get(mode.name, [])
    in_scope = set(keys)
    eps = [e for e in read_results(path) if e.key in in_scope]
    n, planned = len(eps), len(keys)
    ok = sum(e.success > 0.5 for e in eps)
    unfinished = planned - n
    status = dict.fromkeys(STATUSES, 0)
    status.update(Counter(e.status for e in eps))
    status = {k: v for k, v in status.items() if v}
    if unfinished:
        status["unfinished"] = unfinished
    sessions = json.loads(sessions_path(path).read_text())["sessions"] if sessions_path(path).exists() else []
    tokens = sum(e.tokens for e in eps)
    wall = sum(s["wall_s"] for s in sessions)
    r: dict[str, Any] = {
        "results": str(path), "planned": planned, "episodes": n, "unfinished": unfinished, "successes": ok,
        **_rate(ok, n),
        "bounds": [ok / planned, (ok + unfinished) / planned] if planned else None,
        "status": status, "runs": mode.runs, "temperature": mode.temperature,
        "turns": sum(e.turns for e in eps) / n if n else None, "tokens": tokens,
        "wall_s": round(wall, 1), "tokens_per_s": round(tokens / wall, 1) if wall > 0 else None,
        "sessions": len(sessions), "worst_case": plan_.worst_case(mode.name),
    }
    if n and mode.runs > 1:
        runs = aggregate_task(eps, ks=range(1, mode.runs + 1)).success
        r["t_interval_over_runs"] = runs.to_dict()
    return r


def summarize(target: Target, spec: SuiteSpec, plans: Sequence[FamilyPlan], out: Path, *, label: str,
              scale: str, command: str, wall_s: float, engine_s: float, stopped: str = "",
              interrupted: bool = False, protocol: str = "faithful") -> dict[str, Any]:
    """The suite's JSON from the families' files (what `write` turns into suite.json and suite.md)."""
    families: dict[str, Any] = {}
    partial = bool(stopped) or interrupted
    for p in plans:
        f = p.family
        d: dict[str, Any] = {"task": f.name, "split": f.split, "data": f.data, "options": dict(f.options),
                             "concurrency": f.at_once(spec.concurrency),
                             "max_turns": p.max_turns, "max_model_len": p.limits.max_model_len,
                             "max_new_tokens": p.limits.max_new_tokens}
        if p.error:
            d["error"] = p.error
            partial = True
        else:
            for mode in spec.modes:
                d[mode.name] = mode_result(target, p, mode, out)
                partial |= d[mode.name]["unfinished"] > 0
        families[f.name] = d
    reason = [f"{p.family.name} not played" for p in plans if p.error]
    if stopped:
        reason.append(f"the {spec.budget_s / 60:g}-minute budget ran out at {stopped}")
    if interrupted:
        reason.append("stopped by a signal")
    if spec.samples:
        reason.append(f"the first {spec.samples} indices of each split only")
    return {"label": label, "target": target.describe(), "scale": scale, "command": command, "protocol": protocol,
            "partial": partial or spec.samples > 0, "partial_reason": "; ".join(reason),
            "samples": spec.samples, "budget_min": spec.budget_s / 60 if spec.budget_s else None,
            "modes": [m.__dict__ for m in spec.modes], "wall_s": round(wall_s, 1),
            "engine_start_s": round(engine_s, 1), "families": families,
            "average": {m.name: _average(families, m.name) for m in spec.modes}}


def _average(families: Mapping[str, Any], mode: str) -> dict[str, Any] | None:
    """AgentBench's Avg: the mean over its families present (each weighs the same), BFCL apart."""
    rates = [families[t][mode]["success"] for t, _ in AGENTBENCH_COLUMNS
             if t in families and mode in families[t] and families[t][mode]["success"] is not None]
    if not rates:
        return None
    return {"success": sum(rates) / len(rates), "families": len(rates)}


def _cell(r: Mapping[str, Any] | None) -> str:
    if not r or r.get("success") is None:
        return "-" if not r or not r.get("unfinished") else "unfinished"
    lo, hi = r["wilson"]
    text = f"{100 * r['success']:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"
    if r["unfinished"]:
        text += f" ({r['episodes']} of {r['planned']})"
    return text


def markdown(s: Mapping[str, Any]) -> str:
    """suite.md: the model's rows beside the paper's, then per family its split, episodes, statuses, wall time
    and worst case, the settings and the command."""
    fam = s["families"]
    modes = [m["name"] for m in s["modes"]]
    head = ["model", *[t for _, t in AGENTBENCH_COLUMNS], "Avg", "BFCL"]
    lines = [f"# {s['label']}: AgentBench-FC's five families and BFCL", "", s["scale"], ""]
    if s["partial"]:
        lines += [f"**Partial**: {s['partial_reason'] or 'some episodes are unfinished'}. Success is over the "
                  "episodes scored; the unfinished ones are counted in `ended`, never as failures.", ""]
    ours = "; ".join(f"{n}: {d['data']}" for n, d in fam.items())
    lines += [f"Success % [Wilson 95%]. Ours ({s.get('protocol', 'faithful')} protocol for AgentBench's families): "
              f"{ours}. The paper's rows are AgentBench-FC's test set (`eval_tables.PUBLISHED`, which holds no BFCL "
              "numbers). Avg is the mean over the AgentBench families present.", "",
              "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for mode in modes:
        avg = s["average"].get(mode)
        cells = [_cell(fam.get(t, {}).get(mode)) if t in fam else "not run" for t, _ in AGENTBENCH_COLUMNS]
        avg_cell = "-" if not avg else f"{100 * avg['success']:.1f}" + (
            f" ({avg['families']} of {len(AGENTBENCH_COLUMNS)})" if avg["families"] < len(AGENTBENCH_COLUMNS) else "")
        bfcl = _cell(fam["bfcl"].get(mode)) if "bfcl" in fam else "not run"
        lines.append("| " + " | ".join([f"**{s['label']}** {mode} (ours)", *cells, avg_cell, bfcl]) + " |")
    for name, row in PUBLISHED.items():
        lines.append("| " + " | ".join([f"{name} (paper)", *[f"{x:.1f}" for x in row], "-"]) + " |")
    lines += ["", "| family | split | mode | episodes | success % [Wilson 95%] | s.e. | if the unfinished ended "
              "either way | ended | turns | generated tokens (worst case) | wall |", "|" + "---|" * 11]
    for name, d in fam.items():
        if "error" in d:
            lines.append(f"| {name} | {d['split']} | - | - | not played: {d['error']} | | | | | | |")
            continue
        for mode in modes:
            r = d[mode]
            se = f"{100 * r['stderr']:.1f}" if r["stderr"] is not None else "-"
            bounds = f"{100 * r['bounds'][0]:.1f}-{100 * r['bounds'][1]:.1f}" if r["unfinished"] else "-"
            ended = ", ".join(f"{k} {v}" for k, v in r["status"].items()) or "-"
            worst = r["worst_case"]["tokens"]
            tokens = f"{r['tokens']:,} ({worst:,})" if worst is not None else f"{r['tokens']:,} (?)"
            turns = f"{r['turns']:.1f}" if r["turns"] is not None else "-"
            lines.append(f"| {name} | {d['split']} | {mode} | {r['episodes']} of {r['planned']} | {_cell(r)} | {se} | "
                         f"{bounds} | {ended} | {turns} | {tokens} | {_minutes(r['wall_s'])} |")
    lines += ["", f"Wall time: {_minutes(s['wall_s'])} for this command (engine start {s['engine_start_s']:.0f} s); "
                  "a family's is summed over the commands that played it. `ended` counts episodes (completed; "
                  "turn_limit: the task's own round limit; context_limit: the token limit; env_error: counted as a "
                  "failure; unfinished: not played, the budget ran out or the command was stopped).", "",
              "| family | data | turn limit | context | max_new_tokens | at once | task options |",
              "|---|---|---|---|---|---|---|"]
    protocol = s.get("protocol", "faithful")
    for name, d in fam.items():
        opts = ", ".join(f"{k}={v}" for k, v in d["options"].items()) or "-"
        data = d["data"] + (f", {protocol}" if name != "bfcl" else "")
        lines.append(f"| {name} | {data} | {d['max_turns'] if d['max_turns'] is not None else '?'} | "
                     f"{d['max_model_len']} | {d['max_new_tokens']} | {d['concurrency']} | {opts} |")
    if "sampled" in modes:
        lines += ["", "The sampled rows' Wilson interval treats each episode as independent; the runs of one index "
                      "are not, so suite.json also gives each family's t-interval over its runs "
                      "(`t_interval_over_runs`)."]
    lines += ["", "BFCL's first prompts are 3.5-3.8k tokens, so it is given a context of its own (`--bfcl-context`), "
                  "never less than the others'.", "", "```", s["command"], "```", ""]
    return "\n".join(lines)


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def write(summary: Mapping[str, Any], out: Path) -> tuple[Path, Path]:
    """OUT/suite.json and OUT/suite.md, each replaced whole."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in (("suite.json", json.dumps(summary, indent=2)), ("suite.md", markdown(summary))):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(out / name)
        paths.append(out / name)
    return paths[0], paths[1]


def clear(out: Path, target: Target, spec: SuiteSpec) -> None:
    """`--fresh`: the suite's files and each family's files of these stems (other evaluations in OUT stay)."""
    for f in spec.families:
        for mode in spec.modes:
            for p in (out / f.name).glob(f"{stem_of(target, f, mode)}*"):
                p.unlink() if p.is_file() else shutil.rmtree(p)
    for name in ("suite.json", "suite.md"):
        (out / name).unlink(missing_ok=True)


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


@dataclass
class SuiteRun:
    """One invocation: what it needs to write the table whichever way it ends (`plans` once planned)."""

    target: Target
    spec: SuiteSpec
    settings: Settings
    out: Path
    label: str
    scale: str
    command: str
    plans: list[FamilyPlan] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    engine_s: float = 0.0
    stopped: str = ""

    def summary(self, interrupted: bool = False) -> dict[str, Any]:
        return summarize(self.target, self.spec, self.plans, self.out, label=self.label, scale=self.scale,
                         command=self.command, wall_s=time.monotonic() - self.started, engine_s=self.engine_s,
                         stopped=self.stopped, interrupted=interrupted, protocol=self.settings.protocol)


async def run(cfg: Any, state: SuiteRun, inprocess: bool, progress: bool | None = None, dry_run: bool = False,
              say: Callable[[str], None] = print) -> dict[str, Any] | None:
    """The whole suite: the env roles of every family (one controller and its workers, or in this process),
    the plan and its worst case printed, every family played (`run_suite`), suite.{json,md} written; returns the
    summary (None for `dry_run`: the plan only)."""
    from agentrl.evaluation.services import env_client

    async with env_client(cfg, state.out, inprocess) as client:
        state.plans = await plan(client, state.spec, state.settings.limits)
        say("worst case before playing (each task's own turn limit):")
        for line in plan_lines(state.plans, state.spec):
            say(line)
        if state.spec.budget_s:
            say(f"budget: {state.spec.budget_s / 60:g} minutes of wall time; what is left then is unfinished")
        if dry_run:
            return None
        done = await run_suite(client, state.target, state.spec, state.settings, state.out, state.plans,
                               progress, say, state.started)
    state.engine_s, state.stopped = done["engine_s"], done["stopped"]
    summary = state.summary()
    write(summary, state.out)
    return summary


def result_lines(summary: Mapping[str, Any]) -> list[str]:
    """Per family and mode: success, episodes, statuses, wall time against the worst case (the terminal's)."""
    lines = []
    for name, d in summary["families"].items():
        if "error" in d:
            lines.append(f"  {name}: not played: {d['error']}")
            continue
        for m in summary["modes"]:
            r = d[m["name"]]
            worst = r["worst_case"]["tokens"]
            lines.append(f"  {name} {d['split']} {m['name']}: {_cell(r)} over {r['episodes']} of {r['planned']} "
                         f"episodes; ended {', '.join(f'{k} {v}' for k, v in r['status'].items()) or '-'}; "
                         f"{r['tokens']:,} tokens generated (at most {f'{worst:,}' if worst is not None else '?'}) in "
                         f"{_minutes(r['wall_s'])}")
    if summary["partial"]:
        lines.append(f"  partial: {summary['partial_reason'] or 'unfinished episodes'}")
    return lines
