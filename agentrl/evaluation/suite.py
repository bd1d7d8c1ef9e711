"""Running `python -m jobs.eval_suite`: one target's players, every family and mode played into its files within
the budget, each session's wall time recorded, and the table written however the command ends.

    players    one per family and mode (its limits and sampling), sharing one engine or endpoint: `Players`
    bounds     a budget in wall time stops the suite cleanly: the episodes left are unfinished (the table,
               `suite_table`, counts them apart and says it is partial); each session's measured wall time is
               recorded, and as each family starts, its worst case in minutes at the rate measured so far
    files      OUT/<family>/<stem>.jsonl: jobs.eval's results file, transcripts and tables (the same stem and
               fingerprint, so the same command resumes it); OUT/<family>/<stem>.suite.json the sessions;
               OUT/suite.{json,md} the table (`suite_table.summarize`, `suite_table.write`); `clear` for `--fresh`
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import math
import shutil
import time
from collections.abc import Callable, Sequence
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
from agentrl.evaluation.runner import EvalScope
from agentrl.evaluation.suite_plan import FamilyPlan, SuiteSpec, plan, plan_lines, sessions_path, stem_of
from agentrl.evaluation.suite_table import summarize, write
from agentrl.evaluation.targets import Target
from agentrl.monitor.eval_results import ResultsFile, read_results


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


def clear(out: Path, target: Target, spec: SuiteSpec) -> None:
    """`--fresh`: the suite's files and each family's files of these stems (other evaluations in OUT stay)."""
    for f in spec.families:
        for mode in spec.modes:
            for p in (out / f.name).glob(f"{stem_of(target, f, mode)}*"):
                p.unlink() if p.is_file() else shutil.rmtree(p)
    for name in ("suite.json", "suite.md"):
        (out / name).unlink(missing_ok=True)


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

