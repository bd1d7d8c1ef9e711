"""HDF5 shards: round trip, dtypes, atomicity, schema checks, corrupt files, the reader's wait."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from agentrl.transport import shards
from agentrl.transport.shards import ShardError, ShardReader, ShardWriter, read_shard, write_shard
from agentrl.types import SCHEMA_VERSION, Status, Trajectory, TrajectoryBuilder


def make_trajectories(seed: int = 0) -> list[Trajectory]:
    rng = np.random.default_rng(seed)
    out = []
    tasks = ["os", "db", "kg", "alfworld", "webshop", "tâche-ünïcode ✓ 数据库"]
    for i, status in enumerate(Status):
        b = TrajectoryBuilder()
        n_turns = 0 if i == 0 else int(rng.integers(1, 5))  # the first one has zero length
        for _ in range(n_turns):
            b.add_context(rng.integers(0, 150_000, int(rng.integers(0, 30))).tolist())
            n = int(rng.integers(1, 20))
            b.add_action(rng.integers(0, 150_000, n).tolist(), (-rng.random(n) * 5).tolist(),
                         version=int(rng.integers(0, 50)), engine=int(rng.integers(0, 3)))
        out.append(b.build(
            traj_id=f"{seed}-{i:032x}", task=tasks[i % len(tasks)], index=f"idx-{i}", group_id=f"g{i // 2}",
            reward=float(rng.normal()), status=status, num_turns=n_turns,
            timings={"env_s": float(rng.random()), "gen_s": 1.5} if i % 2 else {},
            metrics={"success": float(i % 2), "κ": -0.25},
        ))
    return out


def assert_same(got: Trajectory, want: Trajectory) -> None:
    for name, dtype in shards.ARRAYS.items():
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == dtype and np.array_equal(a, b), name
    assert got.reward == float(np.float32(want.reward))  # stored as float32
    assert isinstance(got.status, Status)
    for name in ("traj_id", "task", "index", "group_id", "status", "num_turns", "timings", "metrics"):
        assert getattr(got, name) == getattr(want, name), name


def test_round_trip(tmp_path: Path) -> None:
    trajs = make_trajectories()
    assert trajs[0].num_tokens == 0 and len({t.status for t in trajs}) == len(Status)
    write_shard(tmp_path / "000000.h5", trajs)
    back = read_shard(tmp_path / "000000.h5")
    assert len(back) == len(trajs)
    for got, want in zip(back, trajs, strict=True):
        assert_same(got, want)


def test_file_layout_and_single_row_read(tmp_path: Path) -> None:
    trajs = make_trajectories(1)
    path = tmp_path / "s.h5"
    write_shard(path, trajs)
    with h5py.File(path, "r") as f:
        assert f.attrs["schema_version"] == SCHEMA_VERSION and f.attrs["num_trajectories"] == len(trajs)
        assert "T" in str(f.attrs["created"])
        for name, dtype in shards.ARRAYS.items():
            assert h5py.check_vlen_dtype(f[name].dtype) == np.dtype(dtype), name
        assert f["reward"].dtype == np.float32 and f["num_turns"].dtype == np.int32
        assert h5py.check_string_dtype(f["task"].dtype).encoding == "utf-8"
        assert np.array_equal(f["tokens"][3], trajs[3].tokens)  # one row, without the others
    picked = read_shard(path, rows=[5, 2])
    assert_same(picked[0], trajs[5])
    assert_same(picked[1], trajs[2])
    with pytest.raises(IndexError):
        read_shard(path, rows=[len(trajs)])


def test_empty_shard_and_awkward_row_shapes(tmp_path: Path) -> None:
    write_shard(tmp_path / "e.h5", [])
    assert read_shard(tmp_path / "e.h5") == []
    trajs = make_trajectories()
    write_shard(tmp_path / "z.h5", trajs[:1])  # one zero-length row alone
    assert_same(read_shard(tmp_path / "z.h5")[0], trajs[0])
    twins = [trajs[1], Trajectory.from_dict({**trajs[1].to_dict(), "traj_id": "twin"})]  # equal lengths
    write_shard(tmp_path / "t.h5", twins)
    for got, want in zip(read_shard(tmp_path / "t.h5"), twins, strict=True):
        assert_same(got, want)


def test_crash_before_rename_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(src: object, dst: object) -> None:
        raise KeyboardInterrupt("killed before rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        ShardWriter(tmp_path).write(make_trajectories())
    assert list(tmp_path.iterdir()) == []  # neither the final name nor a leftover temp file
    assert ShardReader(tmp_path).available() == []


def test_temp_file_never_matches_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    real_replace = os.replace

    def spy(src: str, dst: str) -> None:
        seen.append(Path(src).name)
        assert ShardReader(tmp_path).available() == []  # complete on disk, not yet visible
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    path = ShardWriter(tmp_path).write(make_trajectories())
    assert seen and not shards.SHARD_NAME.match(seen[0]) and seen[0].startswith(".")
    assert ShardReader(tmp_path).available() == [path]


def test_schema_version_mismatch(tmp_path: Path) -> None:
    path = tmp_path / "000000.h5"
    write_shard(path, make_trajectories())
    with h5py.File(path, "a") as f:
        f.attrs["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(ShardError, match=r"000000\.h5.*schema_version"):
        read_shard(path)


def test_missing_dataset(tmp_path: Path) -> None:
    path = tmp_path / "000000.h5"
    write_shard(path, make_trajectories())
    with h5py.File(path, "a") as f:
        del f["logprobs"]
    with pytest.raises(ShardError, match=r"000000\.h5.*logprobs"):
        read_shard(path)


def test_truncated_and_corrupt_files(tmp_path: Path) -> None:
    path = tmp_path / "000000.h5"
    write_shard(path, make_trajectories())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ShardError, match=r"000000\.h5"):
        read_shard(path)
    path.write_bytes(b"not an hdf5 file at all")
    with pytest.raises(ShardError, match=r"000000\.h5"):
        read_shard(path)
    with pytest.raises(FileNotFoundError):
        read_shard(tmp_path / "absent.h5")


def test_writer_numbering_resumes(tmp_path: Path) -> None:
    w = ShardWriter(tmp_path / "shards" / "rollout-0")  # creates the directory
    trajs = make_trajectories()
    assert [w.write(trajs[:1]).name, w.write(trajs[1:2]).name] == ["000000.h5", "000001.h5"]
    (w.directory / ".000002.h5.deadbeef.tmp").write_bytes(b"")  # a crashed write: ignored
    (w.directory / "notes.txt").write_text("x")
    w2 = ShardWriter(w.directory)
    assert w2.write(trajs[2:3]).name == "000002.h5"
    reader = ShardReader(w.directory)
    assert [p.name for p in reader.available()] == ["000000.h5", "000001.h5", "000002.h5"]
    assert_same(reader.read(2)[0], trajs[2])
    with pytest.raises(FileNotFoundError):
        reader.read(3)
    assert ShardReader(tmp_path / "nowhere").available() == []


def test_reader_waits_for_shard(tmp_path: Path) -> None:
    trajs = make_trajectories()
    writer, reader = ShardWriter(tmp_path), ShardReader(tmp_path)
    timer = threading.Timer(0.3, writer.write, args=(trajs,))
    timer.start()
    t0 = time.monotonic()
    try:
        got = reader.wait(0, timeout_s=10.0, poll_s=0.02)
    finally:
        timer.join()
    assert time.monotonic() - t0 >= 0.25 and len(got) == len(trajs)


def test_reader_wait_times_out(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"000007\.h5.*0\.2 s"):
        ShardReader(tmp_path).wait(7, timeout_s=0.2, poll_s=0.05)
    assert 0.2 <= time.monotonic() - t0 < 2.0


WRITER = """
import sys, time
from agentrl.transport.shards import ShardWriter
from tests.transport.test_shards import make_trajectories
w = ShardWriter(sys.argv[1])
print(w.next_seq, flush=True)
trajs = make_trajectories(7)
while True:
    w.write(trajs)
    time.sleep(0.01)
"""


def test_killed_writer_restarts_after_its_last_segment(tmp_path: Path) -> None:
    """A rollout rank's writer is SIGKILLed mid-run; while it ran a reader saw only complete segments;
    its restart continues the numbering after the highest segment and clears the crash's temp files."""
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    d = shards.shard_dir(run_dir, "rollout", 1)
    assert d == run_dir / "shards" / "rollout-1"
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    want = make_trajectories(7)
    seen: dict[int, int] = {}
    for attempt in range(2):
        present = [int(p.name[:-3]) for p in ShardReader(d).available()]
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(d)], cwd=repo, env=env, stdout=subprocess.PIPE,
                                text=True)
        try:
            assert proc.stdout is not None
            assert int(proc.stdout.readline()) == (max(present) + 1 if present else 0)  # continues after the last
            deadline = time.monotonic() + 20
            while len(seen) < 3 * (attempt + 1) and time.monotonic() < deadline:
                for seq, trajs in ShardReader(d).scan(start=max(seen, default=-1) + 1):  # while it writes
                    assert len(trajs) == len(want) and trajs[-1].traj_id == want[-1].traj_id
                    seen[seq] = len(trajs)
                time.sleep(0.02)
        finally:
            proc.kill()
            proc.wait()
    (d / ".000999.h5.0123abcd.tmp").write_bytes(b"half a shard")  # what a kill during a write leaves
    w = ShardWriter(d)
    seqs = [int(p.name[:-3]) for p in ShardReader(d).available()]
    assert seqs == list(range(len(seqs))) and set(seen) <= set(seqs)  # contiguous: no gap, no overwrite
    assert w.next_seq == len(seqs) and not list(d.glob(".*.tmp"))
    assert w.write(want[:1]).name == f"{len(seqs):06d}.h5"
    assert [seq for seq, _ in ShardReader(d).scan(start=len(seqs))] == [len(seqs)]
    assert shards.rank_dirs(run_dir, "rollout") == {1: d} and shards.rank_dirs(tmp_path / "none", "rollout") == {}
