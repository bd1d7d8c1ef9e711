r"""Benchmark the env controller: N concurrent sessions of the `echo` task, through the controller and direct.

Locally (one controller process, --workers worker processes, this process as the client; 127.0.0.1):
    python -m jobs.bench_controller --sessions 10000 --workers 2 --out runs/bench/controller.json
Under Slurm (one node; give it the cores the roles would have):
    srun --ntasks=1 --cpus-per-task=8 python -m jobs.bench_controller --sessions 10000 --workers 4 \
        --out $RUN_DIR/bench/controller.json
Through submitit: `executor.submit(main, ["--sessions", "10000", "--out", path])`.

What it does, every step bounded (`--duration` per load phase and path, `--timeout` for the whole run):
  1. starts the controller (`jobs.controller`) and the workers (`jobs.env_worker`) serving `echo`;
  2. opens N sessions through the controller and N more straight on the workers (the "direct" path,
     N/W per worker), and checks the controller's /status holds all N;
  3. rate phase: interactions arrive at `--rate` per second (an open loop: arrivals do not wait for
     answers), round-robin over each path's N sessions, so latency is one hop's cost at a steady
     load rather than queueing at saturation;
  4. saturate phase: `--concurrency` callers interact back to back: the most interactions per second
     client, controller and workers reach together on this machine;
  5. one keep-alive of all N sessions (POST /touch, batched as the rollout's client does);
  6. cancels every session and checks the controller and the workers hold none.
The two paths take turns in slices of `--slice` seconds (A B B A ...), never overlapping, so drift in
the machine's background load lands on both. "Added latency" is the controller path's percentile
minus the direct path's; the ratio divides them. The controller's own /status overhead (its handler
time minus the time it waited on the worker) is reported beside it: it does not include the extra
network hop, but it does not depend on how busy the other processes keep the cores either.

Caps, so a typo cannot take the machine down: at most 32 worker processes, 100,000 sessions, 1,024
callers, and a connection pool per path of `--connections` sockets. The child processes get SIGKILL
if this process dies (PR_SET_PDEATHSIG), and SIGTERM then SIGKILL when it ends.
On a 2-core machine the client, the controller and the workers compete for the same cores: read the
per-process CPU time per interaction beside the latencies.

Repeats (`agentrl.bench.repeat`): steps 1-6 run `--repeats` times (at least 3), each time with fresh processes,
all on `--cpus` (this process's affinity, inherited by the roles). Under `repeats` the report gives, per path,
the median and min-max over the repeats of the rate phase's p50/p99 and the saturate phase's interactions/s,
and of the per-repeat ratios controller/direct (and the added latency, controller minus direct). The detailed
breakdown beside it is the repeat whose p99 ratio is the median one; `errors` and the sessions goal count every
repeat. `machine` says where it ran (CPU model, affinity, load average before and after, versions, command).
"""
from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from agentrl.auth import auth_header, run_secret
from agentrl.bench import repeat
from agentrl.config import config_from_dict, dump_config
from agentrl.launch import rendezvous
from agentrl.serving.client import EnvClient
from agentrl.serving.process import event_loop_factory, raise_fd_limit
from agentrl.tasks.api import EnvError

REPO = Path(__file__).resolve().parents[1]
TASK = "echo"
MAX_WORKERS, MAX_SESSIONS, MAX_CALLERS = 32, 100_000, 1024
RESOLVABLE_P99_MS = 20.0
"""Above this direct-path p99 the added-latency goal is reported as not measurable on this machine."""


# ------------------------------------------------------------------------------------ processes

def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL when the benchmark process dies (Linux; best effort)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process (Linux /proc), zeros where unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        return int(fields[11]) / tick, int(fields[12]) / tick
    except (OSError, IndexError, ValueError):
        return 0.0, 0.0


class Processes:
    """The controller and worker processes of one benchmark, their logs in the run dir."""

    def __init__(self, run_dir: Path, uvloop: bool) -> None:
        self.run_dir = run_dir
        self.env = {**os.environ, "PYTHONPATH": str(REPO), "AGENTRL_UVLOOP": "1" if uvloop else "0"}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(self, name: str, module: str, *args: str, prefix: tuple[str, ...] = ()) -> None:
        with (self.run_dir / f"{name}.log").open("wb") as log:
            self.procs[name] = subprocess.Popen([sys.executable, *prefix, "-m", module, *args], cwd=REPO,
                                                env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                                preexec_fn=_die_with_parent)

    def check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                tail = (self.run_dir / f"{name}.log").read_text()[-2000:]
                raise RuntimeError(f"{name} exited with {p.returncode}:\n{tail}")

    def cpu(self) -> dict[str, tuple[float, float]]:
        return {name: cpu_seconds(p.pid) for name, p in self.procs.items()}

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


# ------------------------------------------------------------------------------------ load

def percentiles(ms: list[float]) -> dict[str, float]:
    if not ms:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0, "count": 0}
    p50, p90, p99 = np.percentile(np.asarray(ms), [50, 90, 99])
    return {"p50": round(float(p50), 3), "p90": round(float(p90), 3), "p99": round(float(p99), 3),
            "max": round(float(max(ms)), 3), "count": len(ms)}


class Path_:
    """One way to reach the sessions (through the controller, or straight to their workers).

    Interactions go out as pre-encoded bytes over a plain aiohttp session, so the client spends as
    little CPU as it can, and the same on both paths.
    """

    def __init__(self, name: str, connections: int, payload: str, secret: str) -> None:
        self.name = name
        self.http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections, limit_per_host=connections), headers=auth_header(secret),
            timeout=aiohttp.ClientTimeout(total=60.0), skip_auto_headers=("User-Agent",))
        self.payload = payload
        self.sessions: list[tuple[str, str, bytes]] = []  # (interact URL, session id, request body)
        self.busy: set[int] = set()
        self.cursor = 0
        self.latency: dict[str, list[float]] = {"rate": [], "saturate": []}
        self.seconds: dict[str, float] = {"rate": 0.0, "saturate": 0.0}
        self.errors: list[str] = []
        self.touched: set[int] = set()

    def add(self, base_url: str, sid: str) -> None:
        body = json.dumps({"session_id": sid, "message": {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "echo",
                                                         "arguments": json.dumps({"text": self.payload})}}]}})
        self.sessions.append((f"{base_url}/interact", sid, body.encode()))

    def next_free(self) -> int | None:
        """The next session in turn that has no call in flight (None if every one is busy)."""
        n = len(self.sessions)
        for _ in range(min(n, 64)):
            i, self.cursor = self.cursor, (self.cursor + 1) % n
            if i not in self.busy:
                return i
        return None

    async def interact(self, i: int, phase: str) -> None:
        url, _, body = self.sessions[i]
        self.busy.add(i)
        t0 = time.perf_counter()
        try:
            async with self.http.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
                raw = await resp.read()
                status = resp.status
            ms = (time.perf_counter() - t0) * 1000.0
            answer = json.loads(raw)
            if status != 200 or answer.get("done") or answer["messages"][0]["content"] != self.payload:
                self.errors.append(f"interact: HTTP {status}: {raw[:200]!r}")
            else:
                self.latency[phase].append(ms)
                self.touched.add(i)
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError) as e:
            self.errors.append(f"interact: {type(e).__name__}: {e}")
        finally:
            self.busy.discard(i)

    async def at_rate(self, rate: float, seconds: float) -> None:
        """Open loop for `seconds`: call k leaves at t0 + k/rate (skipped if every session is busy)."""
        loop = asyncio.get_running_loop()
        pending: set[asyncio.Task[None]] = set()
        t0, sent = loop.time(), 0
        total = max(1, int(rate * seconds))
        while sent < total:
            due = min(total, int((loop.time() - t0) * rate) + 1)
            while sent < due:
                sent += 1
                i = self.next_free()
                if i is None:
                    self.errors.append("rate: every session busy (the offered rate exceeds what the path serves)")
                    continue
                task = asyncio.create_task(self.interact(i, "rate"))
                pending.add(task)
                task.add_done_callback(pending.discard)
            await asyncio.sleep(max(0.0, t0 + sent / rate - loop.time()))
        if pending:
            await asyncio.wait(pending, timeout=60.0)
        self.seconds["rate"] += loop.time() - t0

    async def saturate(self, callers: int, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        stop_at = t0 + seconds

        async def caller() -> None:
            while loop.time() < stop_at:
                i = self.next_free()
                if i is None:
                    await asyncio.sleep(0.001)
                    continue
                await self.interact(i, "saturate")

        await asyncio.gather(*(caller() for _ in range(min(callers, len(self.sessions)))))
        self.seconds["saturate"] += loop.time() - t0

    def report(self, phase: str) -> dict[str, Any]:
        lat = self.latency[phase]
        return {"interactions": len(lat), "interactions_per_s": round(len(lat) / max(self.seconds[phase], 1e-9), 1),
                "seconds": round(self.seconds[phase], 3), "latency_ms": percentiles(lat)}


async def alternate(paths: list[Path_], duration: float, slice_s: float,
                    run: Callable[[Path_, float], Awaitable[None]]) -> None:
    """Give each path `duration` seconds in slices, in the order A B B A A B ..., never two at once."""
    done, order = 0.0, list(paths)
    while done < duration - 1e-9:
        s = min(slice_s, duration - done)
        for path in order:
            await run(path, s)
        done += s
        order.reverse()


async def bounded(n: int, limit: int, fn: Callable[[int], Awaitable[Any]]) -> list[Any]:
    """fn(0..n-1) with at most `limit` in flight; results in order."""
    sem = asyncio.Semaphore(limit)

    async def one(i: int) -> Any:
        async with sem:
            return await fn(i)

    return await asyncio.gather(*(one(i) for i in range(n)))


# ------------------------------------------------------------------------------------ the run

async def wait_workers(ctrl: EnvClient, n: int, timeout_s: float, procs: Processes) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while True:
        procs.check_alive()
        try:
            workers = [w for w in (await ctrl.status())["workers"] if w["alive"]]
        except EnvError:
            workers = []
        if len(workers) >= n:
            return [w["address"] for w in sorted(workers, key=lambda w: w["worker_id"])]
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(workers)} of {n} workers registered within {timeout_s:.0f}s")
        await asyncio.sleep(0.1)


async def open_sessions(path: Path_, starters: list[EnvClient], n: int, limit: int) -> dict[str, Any]:
    """Session i opens through starters[i % len(starters)]; returns timing."""
    async def start(i: int) -> None:
        client = starters[i % len(starters)]
        try:
            s = await client.start_sample(TASK, f"train-{i % 100_000}")
            path.add(client.base_url, s.session_id)
        except EnvError as e:
            path.errors.append(f"start_sample: {e}")

    t0 = time.perf_counter()
    await bounded(n, limit, start)
    seconds = time.perf_counter() - t0
    return {"sessions": len(path.sessions), "seconds": round(seconds, 3),
            "starts_per_s": round(len(path.sessions) / max(seconds, 1e-9), 1)}


async def cancel_sessions(path: Path_, clients: dict[str, EnvClient], limit: int) -> None:
    async def cancel(i: int) -> None:
        url, sid, _ = path.sessions[i]
        try:
            await clients[url.removesuffix("/interact")].cancel(sid)
        except EnvError as e:
            path.errors.append(f"cancel: {e}")

    await bounded(len(path.sessions), limit, cancel)


async def bench(args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    slots = math.ceil(2 * args.sessions / args.workers) + 16  # both paths' sessions live at once
    cfg = config_from_dict({"envs": {"tasks": [TASK], "workers": args.workers, "slots": slots},
                            "controller": {"heartbeat_s": 1.0, "dead_after_s": 30.0, "session_idle_s": 3600.0,
                                           "request_timeout_s": 60.0}})
    dump_config(cfg, run_dir / "config.yaml")
    secret = run_secret(run_dir)  # the roles started below read the same one
    (run_dir / rendezvous.FILENAME).unlink(missing_ok=True)  # a reused run dir: never an old controller's address
    procs = Processes(run_dir, uvloop=not args.no_uvloop)
    prefix = ("-m", "cProfile", "-o", str(Path(args.profile_controller).resolve())) if args.profile_controller else ()
    report: dict[str, Any] = {}
    clients: dict[str, EnvClient] = {}
    paths: list[Path_] = []
    try:
        procs.spawn("controller", "jobs.controller", "--run-dir", str(run_dir), prefix=prefix)
        for w in range(args.workers):  # they wait for the controller's address in the run dir
            procs.spawn(f"worker-{w}", "jobs.env_worker", "--run-dir", str(run_dir), "--worker-id", f"w{w}")
        url = await asyncio.to_thread(rendezvous.wait_for, run_dir, "controller_url", 60.0)
        # keep-alive off: the benchmark sends its one touch itself, timed
        ctrl = clients[url] = EnvClient(url, timeout_s=60.0, max_connections=args.connections, keepalive_s=None,
                                        secret=secret)
        addresses = await wait_workers(ctrl, args.workers, 60.0, procs)
        for a in addresses:
            clients[a] = EnvClient(a, timeout_s=60.0, max_connections=args.connections, keepalive_s=None,
                                   secret=secret)
        payload = "x" * args.payload_bytes
        through = Path_("controller", args.connections, payload, secret)
        direct = Path_("direct", args.connections, payload, secret)
        paths = [through, direct]
        cpu0, client_cpu0 = procs.cpu(), os.times()

        report["open"] = {"controller": await open_sessions(through, [ctrl], args.sessions, args.open_concurrency),
                          "direct": await open_sessions(direct, [clients[a] for a in addresses], args.sessions,
                                                        args.open_concurrency)}
        status = await ctrl.status()
        report["sessions_held"] = int(status["sessions"].get(TASK, 0))
        report["sessions_held_direct"] = sum([(await clients[a].status())["active"] for a in addresses]) \
            - report["sessions_held"]
        procs.check_alive()

        await alternate(paths, args.duration, args.slice, lambda p, s: p.at_rate(args.rate, s))
        report["controller_overhead_ms"] = (await ctrl.status()).get("overhead_ms")  # mostly the rate phase's calls
        procs.check_alive()
        await alternate(paths, args.duration, args.slice, lambda p, s: p.saturate(args.concurrency, s))
        procs.check_alive()

        t0 = time.perf_counter()
        try:
            missing = await ctrl.touch([sid for _, sid, _ in through.sessions])
        except EnvError as e:
            missing = []
            through.errors.append(f"touch: {e}")
        report["touch"] = {"sessions": len(through.sessions), "ms": round((time.perf_counter() - t0) * 1000.0, 1),
                           "missing": len(missing)}
        through.errors += [f"touch: {sid} is not live" for sid in missing]
        for p in paths:
            await cancel_sessions(p, clients, args.open_concurrency)
        report["sessions_left"] = {"controller": (await ctrl.status())["active_sessions"],
                                   "workers": sum([(await clients[a].status())["active"] for a in addresses])}
        procs.check_alive()
        cpu1, client_cpu1 = procs.cpu(), os.times()

        def used(names: list[str]) -> tuple[float, float]:
            return (sum(cpu1[n][0] - cpu0[n][0] for n in names), sum(cpu1[n][1] - cpu0[n][1] for n in names))

        cpu = {"controller": used(["controller"]), "workers": used([n for n in cpu1 if n != "controller"]),
               "client": (client_cpu1.user - client_cpu0.user, client_cpu1.system - client_cpu0.system)}
        # calls each role served: the controller only the controller path's, workers and client both paths'
        calls = {p.name: len(p.latency["rate"]) + len(p.latency["saturate"]) + 2 * len(p.sessions) for p in paths}
        served = {"controller": calls["controller"], "workers": sum(calls.values()), "client": sum(calls.values())}
        report["cpu_s"] = {k: {"user": round(u, 2), "system": round(s, 2)} for k, (u, s) in cpu.items()}
        report["cpu_us_per_call"] = {k: round((u + s) * 1e6 / max(served[k], 1), 1) for k, (u, s) in cpu.items()}
        report["calls"] = calls
        report["controller_status"] = {k: (await ctrl.status()).get(k) for k in ("errors", "latency_ms_by_route")}
        for p in paths:
            report[p.name] = {"rate": p.report("rate"), "saturate": p.report("saturate"),
                              "sessions_interacted": len(p.touched), "errors": len(p.errors),
                              "error_samples": sorted(set(p.errors))[:10]}
        return report
    finally:
        for p in paths:
            await p.http.close()
        for c in clients.values():
            await c.close()
        procs.stop()


def summarize(args: argparse.Namespace, report: dict[str, Any], fd_limit: int) -> dict[str, Any]:
    c, d = report["controller"], report["direct"]
    added, ratio = {}, {}
    for phase in ("rate", "saturate"):
        cl, dl = c[phase]["latency_ms"], d[phase]["latency_ms"]
        added[phase] = {p: round(cl[p] - dl[p], 3) for p in ("p50", "p99")}
        ratio[phase] = {p: round(cl[p] / dl[p], 2) if dl[p] else None for p in ("p50", "p99")}
    dt = d["saturate"]["interactions_per_s"]
    ratio["saturate_throughput"] = round(c["saturate"]["interactions_per_s"] / dt, 2) if dt else None
    errors = c["errors"] + d["errors"]
    # A 2 ms difference cannot be read off two percentiles that jitter by tens of ms: say so instead
    # of claiming the goal met or missed (the machine was too busy, or a path could not keep up).
    jitter = d["rate"]["latency_ms"]["p99"] > RESOLVABLE_P99_MS
    behind = min(c["rate"]["interactions_per_s"], d["rate"]["interactions_per_s"]) < 0.9 * args.rate
    added_goal = None if jitter or behind else added["rate"]["p99"] < 2.0
    return {
        "sessions": args.sessions, "sessions_held": report["sessions_held"], "errors": errors,
        "interactions_per_s": {"controller": c["saturate"]["interactions_per_s"],
                               "direct": d["saturate"]["interactions_per_s"]},
        "latency_ms_at_rate": {"controller": c["rate"]["latency_ms"], "direct": d["rate"]["latency_ms"]},
        "added_latency_ms": added, "ratio": ratio,
        "controller_overhead_ms": report["controller_overhead_ms"],
        "goal": {"sessions_held_no_errors": report["sessions_held"] >= args.sessions and errors == 0,
                 "added_p99_under_2ms": added_goal},
        "goal_note": None if added_goal is not None else (
            f"added p99 not resolvable: direct p99 {d['rate']['latency_ms']['p99']:.1f} ms "
            f"(> {RESOLVABLE_P99_MS:g} ms means the machine, not the controller, sets the tail)" if jitter else
            f"a path served under 90% of the offered {args.rate:g}/s: lower --rate"),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "fd_limit": fd_limit,
                    "event_loop": "asyncio" if args.no_uvloop else "uvloop where installed",
                    "load_avg_1m_at_end": round(os.getloadavg()[0], 2)},
        **{k: v for k, v in report.items() if k not in ("controller_overhead_ms",)},
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=10_000, help="concurrent sessions held on each path")
    ap.add_argument("--workers", type=int, default=2, help=f"env worker processes (at most {MAX_WORKERS})")
    ap.add_argument("--rate", type=float, default=500.0, help="offered interactions/s in the rate phase")
    ap.add_argument("--concurrency", type=int, default=32, help="callers in the saturate phase")
    ap.add_argument("--open-concurrency", type=int, default=128, help="start/cancel calls in flight")
    ap.add_argument("--connections", type=int, default=256, help="client sockets per path (and per worker)")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per load phase and path")
    ap.add_argument("--slice", type=float, default=1.0, help="seconds a path runs before the other takes over")
    ap.add_argument("--payload-bytes", type=int, default=64, help="echoed text per interaction")
    ap.add_argument("--timeout", type=float, default=900.0, help="bound on each repeat, seconds")
    ap.add_argument("--no-uvloop", action="store_true", help="asyncio's own event loop in every process")
    ap.add_argument("--run-dir", type=Path, default=None, help="config and process logs (default: a temp dir)")
    ap.add_argument("--profile-controller", default=None, help="write the controller's cProfile stats here")
    ap.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    repeat.add_args(ap)
    args = ap.parse_args(argv)
    if not (1 <= args.sessions <= MAX_SESSIONS and 1 <= args.workers <= MAX_WORKERS
            and 1 <= args.concurrency <= MAX_CALLERS and 1 <= args.open_concurrency <= MAX_CALLERS
            and 1 <= args.connections <= 4096):
        ap.error(f"need 1 <= sessions <= {MAX_SESSIONS}, workers <= {MAX_WORKERS}, concurrency and "
                 f"open-concurrency <= {MAX_CALLERS}, connections <= 4096")
    if args.rate <= 0 or args.duration <= 0 or args.slice <= 0 or args.timeout <= 0:
        ap.error("--rate, --duration, --slice and --timeout must be positive")
    return args


def repeat_figures(report: dict[str, Any]) -> dict[str, dict[str, float]]:
    """One repeat's figures per path (and the added latency, controller minus direct), for the spread."""
    figs = {p: {"p50_ms": report[p]["rate"]["latency_ms"]["p50"], "p99_ms": report[p]["rate"]["latency_ms"]["p99"],
                "saturate_per_s": report[p]["saturate"]["interactions_per_s"]} for p in ("controller", "direct")}
    figs["added"] = {k: figs["controller"][k] - figs["direct"][k] for k in ("p50_ms", "p99_ms")}
    return figs


RATIOS = [repeat.Ratio("p50", "controller", "p50_ms", "direct", "p50_ms"),
          repeat.Ratio("p99", "controller", "p99_ms", "direct", "p99_ms"),
          repeat.Ratio("saturate_throughput", "controller", "saturate_per_s", "direct", "saturate_per_s")]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    load_before = os.getloadavg()
    cpus = repeat.parse_cpus(args.cpus)
    env = repeat.pin(cpus, None, args.vllm_bind)
    os.environ.update(env)  # the roles' environment (`Processes`) starts from this process's
    fd_limit = raise_fd_limit()
    reports: list[dict[str, Any]] = []
    samples: dict[str, list[dict[str, float]]] = {"controller": [], "direct": [], "added": []}
    for i in range(args.repeats):  # each repeat alternates the two paths itself, slice by slice
        with tempfile.TemporaryDirectory(prefix="bench-controller-") as tmp:
            run_dir = args.run_dir / f"repeat-{i}" if args.run_dir else Path(tmp)
            run_dir.mkdir(parents=True, exist_ok=True)
            loop = asyncio.new_event_loop if args.no_uvloop else event_loop_factory()
            with asyncio.Runner(loop_factory=loop) as runner:
                reports.append(runner.run(asyncio.wait_for(bench(args, run_dir), args.timeout)))
        for side, figs in repeat_figures(reports[-1]).items():
            samples[side].append(figs)
        print(f"repeat {i + 1}/{args.repeats}: " + ", ".join(
            f"{p} p99 {samples[p][-1]['p99_ms']:.2f} ms" for p in ("controller", "direct")), flush=True)
    spread = repeat.summarize(samples, RATIOS)
    pairs = spread["ratios"]["p99"]["pairs"]
    shown = sorted(range(len(pairs)), key=lambda k: pairs[k])[len(pairs) // 2]
    out = summarize(args, reports[shown], fd_limit)
    errors = sum(r["controller"]["errors"] + r["direct"]["errors"] for r in reports)
    out["errors"] = errors
    out["goal"]["sessions_held_no_errors"] = errors == 0 and min(r["sessions_held"] for r in reports) >= args.sessions
    out["repeats"] = {**spread, "shown": shown}
    out["machine"] = {**out["machine"], **repeat.machine(None, cpus, env, load_before)}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2))
    print(json.dumps({k: out[k] for k in ("sessions", "sessions_held", "errors", "interactions_per_s",
                                          "latency_ms_at_rate", "added_latency_ms", "ratio",
                                          "controller_overhead_ms", "cpu_us_per_call", "goal", "goal_note")},
                     indent=2))
    print(f"(the figures above are repeat {shown + 1} of {args.repeats}, the median p99 ratio; over all repeats:)")
    print(repeat.table(spread))
    return out


if __name__ == "__main__":
    main()
