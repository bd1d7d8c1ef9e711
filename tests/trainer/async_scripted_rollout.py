"""A scripted rollout rank for the asynchronous trainer's tests (a program run under mpiexec, not a test).

    mpiexec -n 1 python -m mpi4py -m jobs.trainer --run-dir R : -n 1 python -m mpi4py THIS R STEPS [broadcast] \
            [first=K] [delay=S]

It plays a synchronous rollout over the real channel: for step k it waits for the notice of v<k>, then writes
and sends `scripted_batches.step_batch(k)` (sampled "by v<k>"), exactly the data the synchronous trainer test feeds
through shards; then it waits for the trainer's stop and closes (`first=K`: from step K on, for a resumed trainer). The shards go to shards/rollout-0 as the
real rollout's do. With `broadcast` it also joins the trainer's weight broadcast as the real rollout does
(`BroadcastWeights`) and writes report/broadcast.json: the version it holds at the end and the largest
difference from the directory's weights of that version.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from mpi4py import MPI  # noqa: F401 - first: MPI_Init of an MPMD world

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scripted_batches import step_batch  # noqa: E402

from agentrl.launch import rendezvous  # noqa: E402
from agentrl.rollout.weight_sources import BroadcastWeights  # noqa: E402
from agentrl.transport import weights  # noqa: E402
from agentrl.transport.mpi_channel import MpiRolloutChannel  # noqa: E402
from agentrl.transport.shards import ShardWriter, shard_dir  # noqa: E402


def main(run_dir: Path, steps: int, broadcast: bool, first: int = 0, delay_s: float = 0.0) -> None:
    ch = MpiRolloutChannel.world(0, trainer=0, timeout_s=300)
    received = BroadcastWeights(run_dir, 0, 1, lambda: rendezvous.read(run_dir), 120) if broadcast else None
    writer = ShardWriter(shard_dir(run_dir, "rollout", 0))
    time.sleep(delay_s)  # `delay=S`: a long fill before the first batch (engines starting, evaluation)
    for k in range(first, steps):  # first > 0: a resumed run, whose earlier steps' shards are written already
        while ch.version < k:
            ch.poll_notices()
            time.sleep(0.01)
        batch = step_batch(k)
        writer.write(batch)
        ch.send(batch)
    while not ch.stopped:
        ch.poll_notices()
        time.sleep(0.01)
    ch.close()
    if received is not None:
        deadline = time.monotonic() + 60
        while (held := received.newest(-1)) is None or held[0] < steps:
            assert time.monotonic() < deadline, f"broadcast: holding {held and held[0]}, error {received.error!r}"
            time.sleep(0.05)
        got = dict(held[1]())
        on_disk = dict(weights.iter_weights(weights.version_dir(run_dir, held[0])))
        diff = max(float((got[k] - v).abs().max()) for k, v in on_disk.items())
        (run_dir / "report" / "broadcast.json").write_text(json.dumps({"version": held[0], "max_diff": diff,
                                                                        "names": sorted(got) == sorted(on_disk)}))


if __name__ == "__main__":
    opts = sys.argv[3:]
    main(Path(sys.argv[1]), int(sys.argv[2]), "broadcast" in opts,
         next((int(o.split("=")[1]) for o in opts if o.startswith("first=")), 0),
         next((float(o.split("=")[1]) for o in opts if o.startswith("delay=")), 0.0))
