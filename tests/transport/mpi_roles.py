"""The two ends of the MPI channel as small programs that tests start under `mpiexec` (not a test file).

    python -m mpi4py tests/transport/mpi_roles.py world-trainer OUT NUM_ROLLOUT TIMEOUT_S [EXPECT]
    python -m mpi4py tests/transport/mpi_roles.py world-rollout OUT TIMEOUT_S
    python -m mpi4py tests/transport/mpi_roles.py bp-trainer OUT PAUSE_S : ... bp-rollout OUT
    python -m mpi4py tests/transport/mpi_roles.py close-trainer OUT : ... close-rollout OUT
    python -m mpi4py tests/transport/mpi_roles.py idle OUT SECONDS

Rollout rank r sends `make_trajectories(seed=r)` in two messages (the second one with a single
trajectory of zero length, an awkward case), then waits for the trainer's stop. The trainer answers
with version notices 8 and 9, then stops everyone, and writes what it received (`trainer.json`: source
rank, the dtypes of the received arrays, and each trajectory's `to_dict`) for the test to compare.
Each rollout rank writes the notices it saw (`rollout-<r>.json`).
"""
from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

from agentrl.transport.channel import Notice
from agentrl.transport.mpi_channel import MpiRolloutChannel, MpiTrainerChannel
from agentrl.types import Trajectory, TrajectoryBuilder
from tests.transport.test_shards import make_trajectories

ARRAYS = ("tokens", "loss_mask", "logprobs", "policy_version", "engine")


def batches(rank: int) -> list[list]:
    trajs = make_trajectories(seed=rank)
    return [trajs[1:], trajs[:1]]


def trainer(ch: MpiTrainerChannel, out: Path, num_rollout: int, timeout_s: float) -> None:
    """Receive everything `num_rollout` ranks send (ranks beyond the ones awaited at start join late)."""
    want = {r: sum(len(b) for b in batches(r)) for r in range(num_rollout)}
    initial = sorted(ch.peers)
    print(f"joined {initial}", flush=True)  # a test starts a late rank after reading this
    got: list[dict] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < sum(want.values()):
        for rank, trajs in ch.recv(timeout_s=1.0):
            got += [{"rank": rank, "dtypes": [str(getattr(t, a).dtype) for a in ARRAYS], "traj": t.to_dict()}
                    for t in trajs]
        if time.monotonic() > deadline:
            raise TimeoutError(f"trainer received {len(got)} of {sum(want.values())} trajectories")
    ch.notify(8)
    ch.notify(9)
    late = ch.close(timeout_s=timeout_s)
    (out / "trainer.json").write_text(json.dumps({"received": got, "late": len(late), "open": ch.open_ranks,
                                                      "initial": initial}))


def rollout(ch: MpiRolloutChannel, out: Path, timeout_s: float) -> None:
    first_version = ch.version
    for batch in batches(ch.rollout_rank):
        ch.send(batch)
    seen: list[Notice] = []
    deadline = time.monotonic() + timeout_s
    while not (seen and seen[-1].stop):
        n = ch.wait_notice(timeout_s=1.0)
        if n is not None:
            seen.append(n)
        if time.monotonic() > deadline:
            raise TimeoutError(f"rollout rank {ch.rollout_rank} saw no stop")
    ch.close(timeout_s=timeout_s)
    (out / f"rollout-{ch.rollout_rank}.json").write_text(json.dumps(
        {"first_version": first_version, "notices": [[n.version, n.stop] for n in seen], "version": ch.version}))


def big_trajectory(i: int, n: int = 200_000) -> Trajectory:
    b = TrajectoryBuilder()
    b.add_action(list(range(n)), [-1.0] * n, version=1, engine=0)
    return b.build(traj_id=f"big{i}", task="os", index="0", group_id="g", reward=0.0, status="completed",
                   num_turns=1)


def backpressure_trainer(ch: MpiTrainerChannel, out: Path, pause_s: float) -> None:
    """Measure the CPU an idle receive costs, then stop receiving for `pause_s`, then take all six."""
    cpu0, wall0 = time.process_time(), time.monotonic()
    while time.monotonic() - wall0 < 1.0:  # the rollout rank waits for "go": nothing can arrive
        assert ch.poll() == []
        time.sleep(ch.poll_s)
    idle_cpu = time.process_time() - cpu0
    ch.notify(1)  # go
    time.sleep(pause_s)  # the queue is "full": receive nothing
    got = 0
    deadline = time.monotonic() + 30
    while got < 6 and time.monotonic() < deadline:
        got += sum(len(b) for _, b in ch.recv(timeout_s=1.0))
    ch.close()
    (out / "trainer.json").write_text(json.dumps({"idle_cpu_s": idle_cpu, "received": got}))


def backpressure_rollout(ch: MpiRolloutChannel, out: Path) -> None:
    while ch.wait_notice(timeout_s=10.0) is None:
        pass
    t = big_trajectory(0)
    waited = sum(ch.send([t]) for _ in range(6))  # max_pending=2: blocks while the trainer is not receiving
    ch.close()
    (out / "rollout-0.json").write_text(json.dumps({"waited_s": waited}))


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _warnings() -> _Warnings:
    handler = _Warnings()
    logging.getLogger("agentrl.transport").addHandler(handler)
    return handler


def close_trainer(ch: MpiTrainerChannel, out: Path) -> None:
    """close() with a rank that says bye only after the timeout: returns (no raise) with what arrived and the
    rank still open; then the trainer exits without answering the bye (the rollout rank's own timeout)."""
    warned = _warnings()
    t0 = time.monotonic()
    late = ch.close(timeout_s=1.0)
    (out / "trainer.json").write_text(json.dumps({"late": len(late), "open": ch.open_ranks,
                                                  "close_s": time.monotonic() - t0, "warnings": warned.messages}))


def close_rollout(ch: MpiRolloutChannel, out: Path) -> None:
    ch.send(batches(0)[0])  # before the stop: the trainer's close returns it as late
    while not ch.stopped:
        ch.wait_notice(timeout_s=1.0)
    time.sleep(1.5)  # past the trainer's close timeout
    warned = _warnings()
    t0 = time.monotonic()
    ch.close(timeout_s=1.0)
    (out / "rollout-0.json").write_text(json.dumps({"close_s": time.monotonic() - t0, "warnings": warned.messages}))


def main(argv: list[str]) -> None:
    role, out = argv[0], Path(argv[1])
    if role == "world-trainer":
        n, t = int(argv[2]), float(argv[3])
        expect = int(argv[4]) if len(argv) > 4 else n  # more than n: the others join through poll
        trainer(MpiTrainerChannel.world(n, version=7, timeout_s=t), out, expect, t)
    elif role == "world-rollout":
        from mpi4py import MPI

        t = float(argv[2])
        rollout(MpiRolloutChannel.world(MPI.COMM_WORLD.Get_rank() - 1, trainer=0, timeout_s=t), out, t)
    elif role == "close-trainer":
        close_trainer(MpiTrainerChannel.world(1, timeout_s=20), out)
    elif role == "close-rollout":
        close_rollout(MpiRolloutChannel.world(0, timeout_s=20), out)
    elif role == "idle":  # a rank that initializes MPI (every rank must: MPI_Init waits for all) but never joins
        from mpi4py import MPI  # noqa: F401

        time.sleep(float(argv[2]))
    elif role == "bp-trainer":
        backpressure_trainer(MpiTrainerChannel.world(1, timeout_s=20), out, float(argv[2]))
    elif role == "bp-rollout":
        backpressure_rollout(MpiRolloutChannel.world(0, max_pending=2, timeout_s=20), out)
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
