"""Chaos run: a short training run during which env workers are killed by pid at random times, and the
trainer once (it resumes from its checkpoint); then every trajectory is accounted for.

    python -m jobs.chaos --quick                      # ~2 minutes on 2 cores: 8 RL steps, kills every few seconds
    python -m jobs.chaos --steps 20 --kill-every 5,15 --seed 3
    srun -n1 -c2 python -m jobs.chaos --quick         # the same inside one allocation

The run is the smoke preset (the synchronous schedule) with two env workers, a checkpoint after every step
and the file channel (`transport.channel=files`: trainer and rollout rank are processes of their own), started
by the local launcher, which restarts what dies (env workers up to `cluster.max_restarts` times each, the
trainer once; the rollout rank follows a restarted trainer by starting again). Prints and writes
runs/bench/chaos.json: kills, sessions the kills hit, rollout retries, trajectories produced (in the rollout's
HDF5 shards), trained, excluded by reason, held when the run ended, `lost_unexplained` (produced but in none
of the trainer's ledger's columns: must be 0) and `completed` (the run finished its steps). Exits 1 if the
run did not complete or lost a trajectory without a reason.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from agentrl.config import dump_config, load_config
from agentrl.launch import rendezvous
from agentrl.launch.local import ROLLOUT_PREFIX, TRAINER, LocalLauncher, start_pipeline


class Killer(threading.Thread):
    """Kills a random live env worker every `every` seconds (uniform in the range), and the trainer once
    after its RL checkpoint of step `trainer_after` (late enough that weights/v0 has been pruned: the
    restarted rollout rank must start from the resumed trainer's version), by pid with SIGKILL: no chance to
    clean up."""

    def __init__(self, launcher: LocalLauncher, every: tuple[float, float], kill_trainer: bool, seed: int,
                 max_worker_kills: int, trainer_after: int = 1) -> None:
        super().__init__(daemon=True)
        self.launcher, self.every, self.kill_trainer = launcher, every, kill_trainer
        self.trainer_after = trainer_after
        self.rng = random.Random(seed)
        self.max_worker_kills = max_worker_kills
        self.kills: list[dict[str, Any]] = []
        self.sessions_at_kill: list[int] = []
        self.stop = threading.Event()

    def run(self) -> None:
        trainer_killed = not self.kill_trainer
        # kills start when the policy's episodes do (weights v0 published: evaluation, then RL steps), so that
        # they hit live sessions rather than a warm start that needs no env
        while not self.stop.wait(0.2) and not (self.launcher.run_dir / "weights" / "v0").exists():
            pass
        next_worker = time.monotonic() + self.rng.uniform(*self.every)
        while not self.stop.wait(0.2):
            roles = self.launcher.roles
            if not trainer_killed and "trainer" in roles and \
                    max(_rl_checkpoints(self.launcher.run_dir), default=0) >= self.trainer_after:
                trainer_killed = self._kill("trainer")
            n_worker_kills = sum(k["role"].startswith("env_worker-") for k in self.kills)
            if time.monotonic() >= next_worker and n_worker_kills < self.max_worker_kills:
                busy = self._busy_workers()  # kill one that holds live sessions: the point is to hit episodes
                if busy:
                    self._kill(self.rng.choice(busy))
                    next_worker = time.monotonic() + self.rng.uniform(*self.every)

    def _sessions_of(self, role: str) -> int:
        for w in _controller_status(self.launcher.run_dir).get("workers", []):
            if "env_" + str(w.get("worker_id", "")) == role:
                return int(w.get("active", 0))
        return 0

    def _busy_workers(self) -> list[str]:
        """Roles of live env workers that hold sessions now (from the controller's /status)."""
        status = _controller_status(self.launcher.run_dir)
        names = []
        for w in status.get("workers", []):
            role = "env_" + str(w.get("worker_id", ""))
            r = self.launcher.roles.get(role)
            if w.get("alive") and w.get("active", 0) > 0 and r is not None and r.proc.poll() is None:
                names.append(role)
        return sorted(names)

    def _kill(self, name: str) -> bool:
        if name.startswith("env_worker-"):
            self.sessions_at_kill.append(self._sessions_of(name))
        proc = self.launcher.roles[name].proc
        if proc.poll() is not None:
            return False
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        versions = sorted(p.name for p in (self.launcher.run_dir / "weights").glob("v*"))  # what a restart finds
        self.kills.append({"role": name, "pid": proc.pid, "t": round(time.time(), 2), "weights": versions})
        print(f"[     chaos] killed {name} (pid {proc.pid})", flush=True)
        return True


def _rl_checkpoints(run_dir: Path) -> list[int]:
    root = run_dir / "ckpt"
    steps = [int(m.group(1)) for p in root.glob("step-*") if (m := re.fullmatch(r"step-(\d+)", p.name))]
    return [s for s in steps if s >= 1]


def account(run_dir: Path) -> dict[str, Any]:
    """Reconcile what the rollout produced (its shards) with the trainer's ledger (report/ledger.json: every id
    consumed, excluded with a reason, or held when the run ended)."""
    from collections import Counter

    from agentrl.transport.shards import ShardReader, rank_dirs

    produced = [t.traj_id for _, d in sorted(rank_dirs(run_dir, "rollout").items())
                for _, ts in ShardReader(d).scan() for t in ts]
    trainer = json.loads((run_dir / "report" / "trainer.json").read_text())
    ledger = json.loads((run_dir / "report" / "ledger.json").read_text())
    consumed, held = set(ledger["consumed"]), set(ledger["held_at_end"])
    excluded = Counter(ledger["excluded"].values())
    seen = consumed | set(ledger["excluded"]) | held
    return {"produced": len(produced), "unique_ids": len(set(produced)), "consumed": len(consumed),
            "trained": int(trainer.get("trajectories_trained", 0)), "excluded": dict(excluded),
            "dropped_in_steps": {k: int(v) for k, v in trainer.items() if k.startswith("dropped_")},
            "held_at_end": len(held), "lost_unexplained": len(set(produced) - seen),
            "steps_done": trainer.get("steps_done"), "rl_steps": trainer.get("rl_steps")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="8 steps, a kill every 2-6 s (at most 3 workers)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--kill-every", default="3,10", help="seconds between worker kills, a range lo,hi")
    ap.add_argument("--max-worker-kills", type=int, default=6)
    ap.add_argument("--no-trainer-kill", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run-root", type=Path, default=Path("runs"))
    ap.add_argument("--out", type=Path, default=Path("runs/bench/chaos.json"))
    args = ap.parse_args(argv)
    steps, every, max_kills = (8, (2.0, 6.0), 3) if args.quick else (args.steps, tuple(
        float(x) for x in args.kill_every.split(",")), args.max_worker_kills)
    cfg = load_config("smoke", [f"run_root={args.run_root}", "name=chaos", f"trainer.steps={steps}",
                                "envs.workers=2", "rollout.groups_per_task=8", "trainer.checkpoint_every=1",
                                "transport.channel=files",
                                "cluster.max_restarts=4", f"seed={args.seed}"])
    run_dir = cfg.run_dir.resolve()
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    dump_config(cfg, run_dir / "config.yaml")
    launcher = LocalLauncher(run_dir)
    killer = Killer(launcher, every, not args.no_trainer_kill, args.seed, max_kills,  # type: ignore[arg-type]
                    trainer_after=max(1, min(4, steps - 2)))
    t0 = time.time()
    failed: str | None = None
    try:
        ends = start_pipeline(launcher, cfg.envs.workers, True, 1, cfg.cluster.engine_threads, channel="files")
        killer.start()
        # the run's wall time, as jobs.train has it (each role bounds its own waits by role_timeout_s)
        failed = launcher.watch(ends, cfg.cluster.time_limit_s or math.inf,
                                restartable=("env_worker-", TRAINER, ROLLOUT_PREFIX),
                                max_restarts=cfg.cluster.max_restarts,
                                # the dead trainer's channel must not be joined by the restarted rollout rank
                                before_restart=lambda name: name == TRAINER and rendezvous.remove(
                                    run_dir, *rendezvous.PIPELINE_KEYS))
    finally:
        killer.stop.set()
        status = _controller_status(run_dir)
        launcher.stop_all()
    completed = failed is None and (run_dir / "report" / "summary.json").exists()
    result: dict[str, Any] = {"completed": completed, "failed_role": failed, "wall_s": round(time.time() - t0, 1),
                              "steps": steps, "kills": killer.kills,
                              "restarts": {n: r.restarts for n, r in launcher.roles.items() if r.restarts}}
    result["controller_errors"] = status.get("errors_by_class", {})
    result["sessions_hit"] = sum(killer.sessions_at_kill)  # live sessions on the workers when they were killed
    result["retries"] = _retries(run_dir)  # RL-step episodes the rollout tried again (evaluations not counted)
    if (run_dir / "report" / "trainer.json").exists():
        result.update(account(run_dir))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    if failed:
        print(launcher.failure_report(failed), file=sys.stderr)
    ok = completed and result.get("lost_unexplained") == 0
    print(f"chaos: {'completed, nothing lost' if ok else 'FAILED'}; wrote {args.out}")
    return 0 if ok else 1


def _controller_status(run_dir: Path) -> dict[str, Any]:
    """The controller's /status (error counts by class), read before the roles are stopped."""
    import urllib.request

    from agentrl.auth import HEADER, SCHEME, run_secret

    try:
        url = json.loads((run_dir / "rendezvous.json").read_text())["controller_url"]
        req = urllib.request.Request(f"{url}/status", headers={HEADER: SCHEME + run_secret(run_dir)})
        with urllib.request.urlopen(req, timeout=5) as r:
            return dict(json.loads(r.read()))
    except (OSError, ValueError, KeyError):
        return {}


def _retries(run_dir: Path) -> int:
    """Episodes the rollout tried again after an env failure (its env/retries metric, summed)."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        return -1
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    if "env/retries" not in acc.Tags().get("scalars", []):
        return 0
    return int(sum(e.value for e in acc.Scalars("env/retries")))


if __name__ == "__main__":
    sys.exit(main())
