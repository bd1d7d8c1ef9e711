"""A discrete-event model of the pipeline (docs/planner.md): rollout ranks, their engines and episodes, the
trainer's queue and steps, weight publishing and in-flight swaps, with the admission rule and batch shape of
the real code. A planning aid: it answers "how fast would this layout go with these rates", in milliseconds,
without a cluster; it does not run a model.

What it follows from the code:
    admission     `RolloutLoop._admit_limit`: group k starts only while
                  k < (max_staleness + engine_version − base + 1) × groups_per_step_of_rank
                  and running + group_size ≤ concurrency (`admit_limit`, `may_admit` below)
    groups        group_size episodes; complete groups enter the trainer's queue in completion order
    trainer       `trainer.role._loop`: waits for min_groups complete groups, takes up to max_groups (oldest
                  first), drops trajectories more than max_staleness versions old, trains a + b·tokens seconds
    weights       a version is visible publish_s after its step ends; a rank takes the newest by `inflight`:
                  swap (generation pauses swap_s, episodes go on, later turns carry the new version), drain
                  (no admission until running episodes end, then swap), abort (running episodes restart)
    episodes      env start, then per turn: generation of `gen_tokens` on the rank's least-loaded engine
                  (processor sharing at the engine's throughput for that many requests), then an env call

What it leaves out (listed in docs/planner.md): the lagging pool (its engines count as ordinary engines),
the queue's capacity (the admission bound keeps it below in every layout we model), prefill cost growing
with context (folded into the calibrated rate), transport time of trajectories, failures and retries.
"""
from __future__ import annotations

import bisect
import heapq
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from agentrl.algorithms.staleness import admit_limit, version_staleness


def may_admit(started: int, limit: int, running: int, group_size: int, concurrency: int) -> bool:
    """`RolloutLoop.run`'s admission test for the next group."""
    return started < limit and running + group_size <= concurrency


def groups_of_rank(total_groups: int, ranks: int, rank: int) -> int:
    """`RankPlace.groups_per_step`: one step's groups split over the ranks, the first ones taking the rest."""
    return total_groups // ranks + (rank < total_groups % ranks)


@dataclass(frozen=True)
class Rates:
    """How fast the parts are: what calibration fits and a user supplies for a cluster."""

    engine_tokens_per_s: float
    """One engine's generated tokens/s with `engine_curve`'s reference load (curve value 1.0)."""
    trainer_step_a_s: float = 0.0
    """A step's fixed cost (optimizer, CPU copy of the weights for publishing), seconds."""
    trainer_step_b_s: float = 1e-4
    """Seconds per trained token (prompt, actions and observations: what the step computes on)."""
    env_median_s: float = 0.0
    env_sigma: float = 0.0
    env_samples: tuple[float, ...] = ()
    """An empirical env-latency list (seconds); used instead of the lognormal when given."""
    publish_s: float = 0.0
    """From the end of a step to its weights being visible to the rollout ranks."""
    swap_s: float = 0.0
    """A rank's engines pause this long to load new weights."""
    turn_overhead_s: float = 0.0
    """The agent loop's own per-turn cost (tokenize, parse, hand-off), added to each generation."""
    start_s: float = 0.0
    """From weights v0 to the ranks' first admission (engine start-up, first load)."""
    engine_curve: tuple[tuple[int, float], ...] = ((1, 1.0),)
    """(requests in flight, relative throughput) points, piecewise linear, flat beyond the ends: how one
    engine's total tokens/s grows with its batch. One point: the same throughput at any load."""

    def engine_rate(self, n: int) -> float:
        """One engine's total tokens/s with n generations in flight (processor sharing among them)."""
        if n <= 0:
            return 0.0
        if len(self.engine_curve) == 1:
            return self.engine_tokens_per_s * self.engine_curve[0][1]
        xs = [p[0] for p in self.engine_curve]
        ys = [p[1] for p in self.engine_curve]
        if n <= xs[0]:
            rel = ys[0]
        elif n >= xs[-1]:
            rel = ys[-1]
        else:
            i = bisect.bisect_right(xs, n)
            x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
            rel = y0 + (y1 - y0) * (n - x0) / (x1 - x0)
        return self.engine_tokens_per_s * rel

    def env_draw(self, rng: random.Random) -> float:
        if self.env_samples:
            return rng.choice(self.env_samples)
        if self.env_median_s <= 0:
            return 0.0
        return self.env_median_s * math.exp(self.env_sigma * rng.gauss(0.0, 1.0))

    def step_s(self, tokens: int) -> float:
        return self.trainer_step_a_s + self.trainer_step_b_s * tokens


@dataclass(frozen=True)
class Workload:
    """What an episode is: turns, tokens generated per turn, tokens trained per episode."""

    turns: float = 3.0
    """Mean turns per episode (a fraction: episodes take floor or ceil, in proportion)."""
    gen_tokens: float = 32.0
    """Action tokens generated per turn."""
    episode_tokens: float = 200.0
    """Tokens per trajectory (prompt, actions, observations): what a trainer step computes on."""
    env_call_frac: float = 1.0
    """Fraction of turns that call the env (a turn with an unreadable call gets an error observation instead)."""


@dataclass(frozen=True)
class Layout:
    """The pipeline's shape (`RunConfig.pipeline` and the cluster section)."""

    ranks: int = 1
    engines_per_rank: int = 1
    concurrency: int = 64
    group_size: int = 4
    step_groups: int = 4
    """groups_per_task × tasks: one synchronous step's groups."""
    min_groups: int = 4
    max_groups: int = 4
    max_staleness: int = 0
    inflight: str = "drain"
    steps: int = 10

    @classmethod
    def sync(cls, step_groups: int, group_size: int, concurrency: int, steps: int, ranks: int = 1,
             engines_per_rank: int = 1) -> Layout:
        """The synchronous schedule (`PipelineShape` with schedule sync): staleness 0, drain, one step's groups."""
        return cls(ranks, engines_per_rank, concurrency, group_size, step_groups, step_groups, step_groups,
                   0, "drain", steps)


@dataclass
class Result:
    steps: int
    trajectories_trained: int
    step_end_s: list[float]
    steady_traj_per_s: float
    e2e_traj_per_s: float
    trainer_idle_frac: float
    rollout_idle_frac: list[float]
    staleness_mean: float
    staleness_max: int
    dropped_stale: int
    aborted: int
    step_time_s: float
    """Mean trainer step (train + publish copy)."""
    fill_s: float
    """From v0 to the first batch."""
    rollout_busy_tokens_per_s: float = 0.0
    """Tokens generated per second a rank had an episode running, mean over ranks (what calibration matches)."""
    gen_in_flight_mean: float = 0.0
    """Generation requests in flight on an engine, averaged over the time it was generating (all engines): the
    load at which a run measures the engine, where a fitted engine curve puts that run's point."""

    def summary(self) -> dict[str, float | int | list[float]]:
        return {"steady_traj_per_s": round(self.steady_traj_per_s, 4), "e2e_traj_per_s": round(self.e2e_traj_per_s, 4),
                "trainer_idle_frac": round(self.trainer_idle_frac, 3),
                "rollout_idle_frac": [round(x, 3) for x in self.rollout_idle_frac],
                "staleness_mean": round(self.staleness_mean, 3), "staleness_max": self.staleness_max,
                "dropped_stale": self.dropped_stale, "aborted": self.aborted,
                "step_time_s": round(self.step_time_s, 3), "fill_s": round(self.fill_s, 3)}


@dataclass(eq=False)
class _Episode:
    group: int
    rank: int
    turns: int
    rng: random.Random
    done_turns: int = 0
    versions: list[int] = field(default_factory=list)
    alive: bool = True


@dataclass(eq=False)
class _Engine:
    """Processor sharing by a virtual clock: `clock` is the service each request in flight has had since the
    engine started; a request submitted at clock c with n tokens finishes when the clock reaches c + n."""

    idx: int = 0
    clock: float = 0.0
    t_last: float = 0.0
    finish: list[tuple[float, int]] = field(default_factory=list)  # heap of (clock at finish, episode id)
    active: set[int] = field(default_factory=set)
    epoch: int = 0  # bumps on every change: older completion events are void
    gen_s: float = 0.0  # time with a generation in flight (and no weight load)
    load_s: float = 0.0  # the integral of requests in flight over that time


@dataclass(eq=False)
class _Rank:
    index: int
    per_step: int
    engines: list[_Engine]
    version: int = 0
    base: int = 0
    started: int = 0
    running: set[int] = field(default_factory=set)
    swapping: bool = False
    idle_s: float = 0.0
    idle_since: float | None = 0.0
    tokens: float = 0.0


class _Sim:
    """One run of the model; `simulate` is its public face."""

    def __init__(self, layout: Layout, rates: Rates, work: Workload, seed: int) -> None:
        self.L, self.R, self.W = layout, rates, work
        self.seed = seed
        self.t = 0.0
        self.heap: list[tuple[float, int, str, tuple]] = []
        self.seq = 0
        self.eps: dict[int, _Episode] = {}
        self.ranks = [_Rank(r, groups_of_rank(layout.step_groups, layout.ranks, r),
                            [_Engine(e) for e in range(layout.engines_per_rank)]) for r in range(layout.ranks)]
        self.group_left: dict[int, int] = {}
        self.group_eps: dict[int, list[int]] = {}
        self.ready: list[int] = []
        self.version = 0  # the trainer's
        self.published = 0
        self.training = False
        self.t_first: float | None = None
        self.wait_since = 0.0
        self.idle_total = 0.0
        self.step_end: list[float] = []
        self.step_times: list[float] = []
        self.stale: list[int] = []
        self.dropped = 0
        self.trained = 0
        self.aborted = 0
        self.next_group = 0

    # -- events ------------------------------------------------------------------------------------------
    def at(self, dt: float, kind: str, *args: object) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (self.t + dt, self.seq, kind, args))

    def run(self) -> Result:
        self.at(self.R.start_s, "start")
        while self.heap and len(self.step_end) < self.L.steps:
            self.t, _, kind, args = heapq.heappop(self.heap)
            getattr(self, "_on_" + kind)(*args)
        return self._result()

    def _on_start(self) -> None:
        for rank in self.ranks:
            self._admit(rank)

    # -- rollout -----------------------------------------------------------------------------------------
    def _turns(self, rng: random.Random) -> int:
        lo = math.floor(self.W.turns)
        return max(1, lo + (rng.random() < self.W.turns - lo))

    def _admit(self, rank: _Rank) -> None:
        L = self.L
        hold = L.inflight == "drain" and (rank.swapping or self.published > rank.version)
        while not hold and may_admit(rank.started, admit_limit(L.max_staleness, rank.version, rank.base,
                                                               rank.per_step),
                                     len(rank.running), L.group_size, L.concurrency):
            g = self.next_group
            self.next_group += 1
            rank.started += 1
            self.group_left[g] = L.group_size
            self.group_eps[g] = []
            for _ in range(L.group_size):
                self._start_episode(rank, g)
        self._idle_mark(rank)

    def _start_episode(self, rank: _Rank, group: int) -> None:
        eid = len(self.eps)
        # each episode draws from its own stream: the same episode waits as long whatever the rates, so two
        # models that differ in one rate differ by that rate alone (what the calibration's fit relies on)
        rng = random.Random(self.seed * 1_000_003 + eid)
        self.eps[eid] = _Episode(group, rank.index, self._turns(rng), rng)
        self.group_eps[group].append(eid)
        rank.running.add(eid)
        self.at(self.R.env_draw(rng), "env_done", eid)

    def _idle_mark(self, rank: _Rank) -> None:
        if rank.running and rank.idle_since is not None:
            rank.idle_s += self.t - rank.idle_since
            rank.idle_since = None
        elif not rank.running and rank.idle_since is None:
            rank.idle_since = self.t

    def _on_env_done(self, eid: int) -> None:
        ep = self.eps[eid]
        if not ep.alive:
            return
        if ep.done_turns >= ep.turns:
            self._finish(eid)
            return
        if self.R.turn_overhead_s > 0:
            self.at(self.R.turn_overhead_s, "gen_submit", eid)
        else:
            self._on_gen_submit(eid)

    def _on_gen_submit(self, eid: int) -> None:
        ep = self.eps[eid]
        if not ep.alive:
            return
        rank = self.ranks[ep.rank]
        eng = min(rank.engines, key=lambda e: len(e.active))
        self._advance(rank, eng)
        heapq.heappush(eng.finish, (eng.clock + max(self.W.gen_tokens, 1e-9), eid))
        eng.active.add(eid)
        self._reschedule(rank, eng)

    def _advance(self, rank: _Rank, eng: _Engine) -> None:
        """Progress every generation on `eng` up to now (none while the rank loads weights)."""
        n = len(eng.active)
        if n and not rank.swapping:
            eng.clock += self.R.engine_rate(n) / n * (self.t - eng.t_last)
            eng.gen_s += self.t - eng.t_last
            eng.load_s += n * (self.t - eng.t_last)
        eng.t_last = self.t

    def _reschedule(self, rank: _Rank, eng: _Engine) -> None:
        eng.epoch += 1
        while eng.finish and eng.finish[0][1] not in eng.active:  # aborted episodes
            heapq.heappop(eng.finish)
        if not eng.active or rank.swapping:
            return
        n = len(eng.active)
        self.at(max(eng.finish[0][0] - eng.clock, 0.0) / (self.R.engine_rate(n) / n), "gen_done", rank.index,
                eng.idx, eng.epoch)

    def _on_gen_done(self, r: int, e: int, epoch: int) -> None:
        rank = self.ranks[r]
        eng = rank.engines[e]
        if epoch != eng.epoch:
            return
        self._advance(rank, eng)
        while eng.finish and eng.finish[0][0] <= eng.clock + 1e-9:
            _, eid = heapq.heappop(eng.finish)
            if eid not in eng.active:
                continue
            eng.active.discard(eid)
            ep = self.eps[eid]
            ep.versions.append(rank.version)
            ep.done_turns += 1
            rank.tokens += self.W.gen_tokens
            calls = ep.rng.random() < self.W.env_call_frac
            self.at(self.R.env_draw(ep.rng) if calls else 0.0, "env_done", eid)
        self._reschedule(rank, eng)

    def _finish(self, eid: int) -> None:
        ep = self.eps[eid]
        rank = self.ranks[ep.rank]
        rank.running.discard(eid)
        self.group_left[ep.group] -= 1
        if self.group_left[ep.group] == 0:
            self.ready.append(ep.group)
        self._maybe_swap(rank)
        self._admit(rank)
        self._try_train()

    # -- weights -----------------------------------------------------------------------------------------
    def _on_publish(self, version: int) -> None:
        self.published = max(self.published, version)
        for rank in self.ranks:
            self._maybe_swap(rank)

    def _maybe_swap(self, rank: _Rank) -> None:
        if rank.swapping or self.published <= rank.version:
            return
        mode = self.L.inflight
        if mode == "drain" and rank.running:
            return
        restart: list[int] = []
        if mode == "abort" and rank.running:
            for eid in list(rank.running):
                self._kill(rank, eid)
                restart.append(self.eps[eid].group)
            self.aborted += len(restart)
        for eng in rank.engines:
            self._advance(rank, eng)
        rank.swapping = True
        for eng in rank.engines:
            eng.epoch += 1  # generation pauses
        self.at(self.R.swap_s, "swap_done", rank.index, self.published, tuple(restart))

    def _kill(self, rank: _Rank, eid: int) -> None:
        ep = self.eps[eid]
        ep.alive = False
        rank.running.discard(eid)
        self.group_eps[ep.group].remove(eid)
        for eng in rank.engines:
            eng.active.discard(eid)

    def _on_swap_done(self, r: int, version: int, restart: tuple[int, ...]) -> None:
        rank = self.ranks[r]
        for eng in rank.engines:
            eng.t_last = self.t
        rank.version, rank.swapping = version, False
        for g in restart:  # the same groups again, on the new weights
            self._start_episode(rank, g)
        for eng in rank.engines:
            self._reschedule(rank, eng)
        self._maybe_swap(rank)
        self._admit(rank)

    # -- trainer -----------------------------------------------------------------------------------------
    def _try_train(self) -> None:
        L = self.L
        if self.training or len(self.step_end) >= L.steps or len(self.ready) < max(L.min_groups, 1):
            return
        take, self.ready = self.ready[:L.max_groups], self.ready[L.max_groups:]
        if self.t_first is None:
            self.t_first = self.t
        else:
            self.idle_total += self.t - self.wait_since
        used = 0
        for g in take:
            for eid in self.group_eps.pop(g):
                ep = self.eps[eid]
                s = version_staleness(min(ep.versions, default=-1), self.version)
                if s > L.max_staleness:  # the queue's staleness filter: excluded, not in the step's statistics
                    self.dropped += 1
                else:
                    self.stale.append(s)
                    used += 1
        self.trained += used
        dt = self.R.step_s(round(used * self.W.episode_tokens))
        self.step_times.append(dt)
        self.training = True
        self.at(dt, "train_done")

    def _on_train_done(self) -> None:
        self.training = False
        self.version += 1
        self.step_end.append(self.t)
        self.wait_since = self.t
        self.at(self.R.publish_s, "publish", self.version)
        self._try_train()

    def _result(self) -> Result:
        n = len(self.step_end)
        if n == 0:
            raise RuntimeError("the model made no step: check that admission can fill a batch")
        per_step = self.trained / n
        steady = (n - 1) * per_step / max(self.step_end[-1] - self.step_end[0], 1e-9) if n > 1 else 0.0
        end = self.step_end[-1]
        wall = max(end - (self.t_first or 0.0), 1e-9)
        r_idle, busy_rate = [], []
        for rank in self.ranks:
            idle = max(rank.idle_s + (end - rank.idle_since if rank.idle_since is not None else 0.0) - self.R.start_s,
                       0.0)
            r_idle.append(idle / max(end - self.R.start_s, 1e-9))
            busy_rate.append(rank.tokens / max(end - self.R.start_s - idle, 1e-9))
        return Result(n, self.trained, list(self.step_end), steady, self.trained / max(end, 1e-9),
                      self.idle_total / wall, r_idle, sum(self.stale) / max(len(self.stale), 1),
                      max(self.stale, default=0), self.dropped, self.aborted,
                      sum(self.step_times) / len(self.step_times), self.t_first or 0.0,
                      sum(busy_rate) / len(busy_rate),
                      sum(e.load_s for r in self.ranks for e in r.engines)
                      / max(sum(e.gen_s for r in self.ranks for e in r.engines), 1e-9))


def simulate(layout: Layout, rates: Rates, work: Workload, seed: int = 0) -> Result:
    """Run the model until the trainer has taken `layout.steps` steps.

    Throughput as `jobs.bench_pipeline` measures it: steady state counts steps 2..N over the time from the end of
    step 1 to the end of step N; end to end counts all N steps from weights v0 (time 0)."""
    return _Sim(layout, rates, work, seed).run()


def simulate_mean(layout: Layout, rates: Rates, work: Workload, seeds: Sequence[int] = (0, 1, 2)) -> dict[str, float]:
    """Median over seeds of the headline numbers (the env latency's tail makes one run noisy)."""
    runs = [simulate(layout, rates, work, s) for s in seeds]

    def med(f: Callable[[Result], float]) -> float:
        xs = sorted(f(r) for r in runs)
        return xs[len(xs) // 2]

    return {"steady_traj_per_s": med(lambda r: r.steady_traj_per_s), "e2e_traj_per_s": med(lambda r: r.e2e_traj_per_s),
            "trainer_idle_frac": med(lambda r: r.trainer_idle_frac),
            "rollout_idle_frac": med(lambda r: sum(r.rollout_idle_frac) / len(r.rollout_idle_frac)),
            "staleness_mean": med(lambda r: r.staleness_mean), "staleness_max": max(r.staleness_max for r in runs)}


def with_schedule(layout: Layout, schedule: str, max_staleness: int = 1, inflight: str = "swap") -> Layout:
    """The same layout on the synchronous schedule (fixed shape) or the asynchronous one."""
    if schedule == "sync":
        return replace(layout, min_groups=layout.step_groups, max_groups=layout.step_groups, max_staleness=0,
                       inflight="drain")
    return replace(layout, max_staleness=max_staleness, inflight=inflight)
