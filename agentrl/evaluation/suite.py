"""Running `python -m jobs.eval_suite`: one target's players, every family and mode played into its files within
the budget, each session's wall time recorded, and the table written however the command ends.

    players    one per family and mode (its limits and sampling), sharing one engine or endpoint: `Players`
    at once    every family and mode not yet scored plays at the same time: at most `spec.concurrency` episodes
               in flight across them (the engine's batch: more would only queue in its KV cache), each family
               at most its own `at_once` of them, greedy and sampled together (`Slots`); as one family ends, its
               slots go to the others. `spec.sequential`: one after another, in order
    bounds     a budget in wall time stops the suite cleanly: the episodes left are unfinished (the table,
               `suite_table`, counts them apart and says it is partial); each session's measured wall time is
               recorded (with the sessions it overlapped), and as a session starts, or ends while others play,
               the worst case of what is left in minutes at the rate measured so far
    files      OUT/<family>/<stem>.jsonl: jobs.eval's results file, transcripts and tables (the same stem and
               fingerprint, so the same command resumes it, at once or sequentially); OUT/<family>/<stem>.suite.json
               the sessions; OUT/suite.{json,md} the table (`suite_table.summarize`, `suite_table.write`); `clear`
               for `--fresh`
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import math
import shutil
import time
from collections import Counter, deque
from collections.abc import Callable, Coroutine, Mapping, Sequence
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
from agentrl.evaluation.suite_plan import FamilyPlan, Mode, SuiteSpec, plan, plan_lines, sessions_path, stem_of
from agentrl.evaluation.suite_table import summarize, write
from agentrl.evaluation.targets import Target
from agentrl.monitor.eval_results import Key, ResultsFile, ScoredEpisode, read_results


class Players:
    """The players of one target, one per family and mode (their own limits and sampling), sharing one engine
    (a local model, loaded at the first family that needs it, with the longest context of the suite) or one
    endpoint; `engine_s` is what loading it took."""

    def __init__(self, stack: contextlib.AsyncExitStack, client: Any, target: Target, settings: Settings,
                 concurrency: int, engine_len: int) -> None:
        self.stack, self.client, self.target, self.settings = stack, client, target, settings
        self.concurrency, self.engine_len = concurrency, engine_len
        self._shared: Any = None
        self._opening = asyncio.Lock()  # sessions at once ask for it together: one engine
        self.engine_s = 0.0

    async def _open(self) -> Any:
        async with self._opening:
            if self._shared is None:
                t0 = time.monotonic()
                wide = replace(self.settings, limits=replace(self.settings.limits, max_model_len=self.engine_len))
                policy = chat_policy if self.target.is_endpoint else local_model
                self._shared = await self.stack.enter_async_context(policy(self.target, wide, self.concurrency))
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


class Slots:
    """At most `n` episodes in flight across the sessions playing at once, and at most `caps[family]` of one
    family's (its modes together: db's MariaDB servers are per episode, whichever the mode). A freed slot goes to
    the waiting family with the fewest in flight, so a family capped low gets its slots back at once rather than
    queueing behind the others' episodes and being left to play alone, a few at a time, at the end."""

    def __init__(self, n: int, caps: Mapping[str, int]) -> None:
        self.free, self.caps = n, dict(caps)
        self.busy: Counter[str] = Counter()
        self.waiting: dict[str, deque[asyncio.Future[None]]] = {}

    def of(self, family: str) -> _Slot:
        """What one of `family`'s episodes holds while it plays (`runner.score`'s `shared`)."""
        return _Slot(self, family)

    async def acquire(self, family: str) -> None:
        fut = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(family, deque()).append(fut)
        self._wake()
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # granted as it was cancelled: hand it on
                self.release(family)
            else:
                with contextlib.suppress(ValueError):
                    self.waiting[family].remove(fut)
            raise

    def release(self, family: str) -> None:
        self.busy[family] -= 1
        self.free += 1
        self._wake()

    def _wake(self) -> None:
        while self.free > 0:
            for q in self.waiting.values():
                while q and q[0].done():  # waiters cancelled before their turn
                    q.popleft()
            ready = [f for f, q in self.waiting.items() if q and self.busy[f] < self.caps.get(f, math.inf)]
            if not ready:
                return
            family = min(ready, key=lambda f: self.busy[f])
            self.free -= 1
            self.busy[family] += 1
            self.waiting[family].popleft().set_result(None)


class _Slot(contextlib.AbstractAsyncContextManager[None]):
    def __init__(self, slots: Slots, family: str) -> None:
        self.slots, self.family = slots, family

    async def __aenter__(self) -> None:
        await self.slots.acquire(self.family)

    async def __aexit__(self, *exc: object) -> None:
        self.slots.release(self.family)


def record_session(results: Path, entry: dict[str, Any]) -> None:
    """Add one session's wall time to OUT/<family>/<stem>.suite.json."""
    path = sessions_path(results)
    old = json.loads(path.read_text()) if path.exists() else {"sessions": []}
    old["sessions"].append(entry)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(old, indent=2))
    tmp.replace(path)


@dataclass
class Session:
    """One family and mode to play: its results file, settings, scope and fingerprint, `done` the episodes its
    file held before this command; `t0`, `t1` when this command's scoring of it started and stopped."""

    plan: FamilyPlan
    mode: Mode
    path: Path
    settings: Settings
    scope: EvalScope
    fingerprint: dict[str, Any]
    done: set[Key]
    t0: float | None = None
    t1: float | None = None

    @property
    def name(self) -> str:
        return f"{self.plan.family.name} {self.mode.name}"

    @property
    def keys(self) -> list[Key]:
        return self.plan.keys[self.mode.name]

    def new(self) -> list[ScoredEpisode]:
        """The episodes this command has scored so far."""
        keyset = set(self.keys)
        return [e for e in read_results(self.path) if e.key in keyset and e.key not in self.done]

    def worst_left(self) -> int:
        """The context's cap on the tokens the episodes still to score may generate."""
        left = len(self.keys) - len(self.done) - (len(self.new()) if self.t0 is not None else 0)
        return self.plan.worst_case(self.mode.name)["context_capped"] * left // max(1, len(self.keys))


def sessions_of(target: Target, spec: SuiteSpec, settings: Settings, out: Path,
                plans: Sequence[FamilyPlan]) -> list[Session]:
    """Every family and mode of the plans that can be played, in the suite's order. The fingerprint holds
    neither the concurrency nor whether the families played at once (neither changes an episode), so a suite
    started one way resumes the other."""
    sessions = []
    for p in plans:
        if p.error:
            continue
        for mode in spec.modes:
            path = out / p.family.name / f"{stem_of(target, p.family, mode)}.jsonl"
            s = replace(settings, temperature=mode.temperature, top_p=mode.top_p, limits=p.limits)
            scope = EvalScope((p.family.name,), p.family.split, spec.samples, mode.runs,
                              p.family.at_once(spec.concurrency))
            done = {e.key for e in read_results(path)} & set(p.keys[mode.name])
            sessions.append(Session(p, mode, path, s, scope, s.fingerprint(scope, [target]), done))
    return sessions


def busy_s(spans: Sequence[tuple[float, float]]) -> float:
    """Seconds in which at least one of `spans` was open: sessions at once count once (the engine's time)."""
    total, end = 0.0, -math.inf
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


class SuitePlay:
    """What the sessions of one `run_suite` share: the players, the deadline, the slots when they play at once,
    which ones started and which the budget stopped."""

    def __init__(self, players: Players, target: Target, deadline: float, slots: Slots | None,
                 progress: bool | None, say: Callable[[str], None]) -> None:
        self.players, self.target, self.deadline, self.slots, self.say = players, target, deadline, slots, say
        self.progress = False if slots is not None else progress  # bars at once would share one row
        self.started: list[Session] = []
        self.stopped: set[str] = set()

    def rate(self) -> float:
        """Tokens per second this command has generated so far, over the time any session was scoring."""
        now = time.monotonic()
        spans = [(s.t0, s.t1 if s.t1 is not None else now) for s in self.started if s.t0 is not None]
        tokens, secs = sum(e.tokens for s in self.started for e in s.new()), busy_s(spans)
        return tokens / secs if tokens > 0 and secs > 0 else 0.0

    def minutes(self, worst: int) -> str:
        rate = self.rate()
        return (f"; at the {rate:.0f} tokens/s this command measured so far, its {worst:,} tokens at most "
                f"would take {worst / rate / 60:.0f} min") if rate else ""

    async def play(self, s: Session) -> None:
        """Score what is left of one session within the deadline (nothing if already scored); a context that
        cannot hold its first prompts marks its family unplayable and leaves the other families playing."""
        p, say = s.plan, self.say
        if p.error:
            return
        if len(s.done) == len(set(s.keys)):
            check_resumable(s.path.with_suffix(".meta.json"), s.fingerprint)
            say(f"{s.name}: all {len(s.keys)} episodes already scored in {s.path}")
            return
        if time.monotonic() >= self.deadline:
            self.stopped.add(s.name)
            say(f"{s.name}: not started, the budget is spent")
            return
        try:
            player = await self.players.player(s.settings, s.scope)
        except ValueError as e:  # a context that cannot hold the first prompts
            if not p.error:
                p.error = str(e)
                say(f"{p.family.name}: cannot be played: {e}")
            return
        say(f"{s.name}: scoring {len(s.keys) - len(s.done)} of {len(s.keys)} episodes into {s.path}"
            + self.minutes(s.worst_left()))
        if await self.score(s, player):
            with ResultsFile(s.path) as rf:
                tables(rf, s.keys, s.path.parent, s.path.stem, self.target.label)
            self.say_left(s)

    async def score(self, s: Session, player: Any) -> bool:
        """Play the session's episodes until done or the deadline (False then), its wall time recorded however
        it ends."""
        s.t0, wall_t0 = time.monotonic(), time.time()
        self.started.append(s)
        stopped = ""
        shared = self.slots.of(s.plan.family.name) if self.slots is not None else None
        try:
            async with asyncio.timeout(None if math.isinf(self.deadline) else
                                       max(0.0, self.deadline - time.monotonic())) as cm:
                await score_into(player, s.keys, s.path, s.fingerprint, s.scope.concurrency, self.progress,
                                 shared, s.mode.name if shared is not None else "")
        except TimeoutError:
            if not cm.expired():
                raise
            stopped = "budget"
            self.stopped.add(s.name)
            self.say(f"{s.name}: the budget is spent; the episodes left are unfinished")
        except BaseException:
            stopped = "error or signal"
            raise
        finally:  # each session's wall time, however it ended
            s.t1 = time.monotonic()
            alongside = [o.name for o in self.started if o is not s and o.t0 is not None and o.t0 < s.t1
                         and (o.t1 is None or o.t1 > s.t0)]
            record_session(s.path, {"started": wall_t0, "wall_s": round(s.t1 - s.t0, 3), "scored": len(s.new()),
                                    "stopped": stopped, **({"alongside": alongside} if alongside else {})})
        return not stopped

    def say_left(self, s: Session) -> None:
        """As a session ends while others play: what they have left at most, in minutes at the rate so far."""
        playing = [o for o in self.started if o.t1 is None]
        if playing:
            self.say(f"{s.name}: {len(s.new())} episodes scored in {s.t1 - (s.t0 or 0.0):.0f} s; "
                     f"{len(playing)} still playing ({', '.join(o.name for o in playing)})"
                     + self.minutes(sum(o.worst_left() for o in playing)))


async def together(coros: Sequence[Coroutine[Any, Any, None]]) -> None:
    """Await every one at once; the first exception of one (settings that do not fit a results file) cancels
    the others and is raised as itself, as the sequential order would raise it."""
    try:
        async with asyncio.TaskGroup() as tg:
            for c in coros:
                tg.create_task(c)
    except BaseExceptionGroup as group:
        raise group.exceptions[0] from None


async def run_suite(client: Any, target: Target, spec: SuiteSpec, settings: Settings, out: Path,
                    plans: Sequence[FamilyPlan], progress: bool | None = None, say: Callable[[str], None] = print,
                    started: float | None = None) -> dict[str, Any]:
    """Play every family and mode of `plans` not yet scored into OUT/<family>/, all at once (or one after
    another: `spec.sequential`), within the budget from `started` (time.monotonic()); returns what the run did
    (`engine_s`, `stopped`: the sessions the budget stopped or left unstarted, or the first of them when
    sequential)."""
    t_start = time.monotonic() if started is None else started
    deadline = t_start + spec.budget_s if spec.budget_s > 0 else math.inf
    engine_len = max([p.limits.max_model_len for p in plans if not p.error] or [settings.limits.max_model_len])
    sessions = sessions_of(target, spec, settings, out, plans)
    async with contextlib.AsyncExitStack() as stack:
        players = Players(stack, client, target, settings, spec.concurrency, engine_len)
        if spec.sequential:
            run = SuitePlay(players, target, deadline, None, progress, say)
            for s in sessions:
                await run.play(s)
        else:
            caps = {p.family.name: p.family.at_once(spec.concurrency) for p in plans}
            run = SuitePlay(players, target, deadline, Slots(spec.concurrency, caps), progress, say)
            if len(left := [s for s in sessions if len(s.done) < len(s.keys)]) > 1:
                capped = "".join(f", {f} at most {n}" for f, n in caps.items() if n < spec.concurrency)
                say(f"playing {', '.join(s.name for s in left)} at once: at most {spec.concurrency} episodes in "
                    f"flight across them{capped} (--sequential: one after another)")
            await together([run.play(s) for s in sessions])
    stopped = [s.name for s in sessions if s.name in run.stopped]
    return {"engine_s": players.engine_s, "stopped": ", ".join(stopped[:1] if spec.sequential else stopped)}


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

