"""The file-only channel with real shard segments and real files in a tmp run dir: which segments the trainer
reads and in what order (late ranks, restarted writers, segments that existed before it opened), the notice
file (newest version, stop, files of another life ignored), goodbyes, and timeouts that name the peer."""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from agentrl.launch import rendezvous
from agentrl.transport.channel import Notice
from agentrl.transport.file_channel import (
    CHANNEL_DIR,
    CHANNEL_KEY,
    FileRolloutChannel,
    FileTrainerChannel,
    _write_json,
    shard_positions,
)
from agentrl.transport.shards import ShardWriter, shard_dir
from agentrl.types import Status, Trajectory, TrajectoryBuilder

POLL = 0.01


def traj(rank: int, seg: int, m: int) -> Trajectory:
    b = TrajectoryBuilder()
    b.add_context([1, 2])
    b.add_action([3, 4, 5], [-0.1, -0.2, -0.3], version=0, engine=rank)
    return b.build(traj_id=f"r{rank}s{seg}m{m}", task="lookup", index="0", group_id=f"r{rank}s{seg}",
                   reward=1.0, num_turns=1, status=Status.COMPLETED)


def write_segments(run_dir: Path, rank: int, n: int) -> list[str]:
    """n segments of 2 trajectories each from a fresh writer (which continues the directory's numbering)."""
    w = ShardWriter(shard_dir(run_dir, "rollout", rank))
    ids = []
    for _ in range(n):
        seq = w.next_seq
        batch = [traj(rank, seq, m) for m in range(2)]
        w.write(batch)
        ids += [t.traj_id for t in batch]
    return ids


def ids(got: list[tuple[int, list[Trajectory]]]) -> list[tuple[int, str]]:
    return [(rank, t.traj_id) for rank, batch in got for t in batch]


def open_pair(run_dir: Path, ranks: int, version: int = 0, join: tuple[int, ...] | None = None,
              timeout_s: float = 10.0) -> tuple[FileTrainerChannel, dict[int, FileRolloutChannel]]:
    """The trainer's open (which waits for hellos) on a thread, the rollout ranks joining from this one."""
    box: dict[str, object] = {}

    def trainer() -> None:
        try:
            box["ch"] = FileTrainerChannel.open(run_dir, ranks, rendezvous.publish, version=version,
                                                timeout_s=timeout_s, poll_s=POLL)
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            box["error"] = e

    t = threading.Thread(target=trainer)
    t.start()
    rollouts = {r: FileRolloutChannel.connect(run_dir, r, rendezvous.read, timeout_s=10.0, poll_s=POLL)
                for r in (range(ranks) if join is None else join)}
    t.join(timeout=timeout_s + 5)
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["ch"], rollouts  # type: ignore[return-value]


def poll_until(ch: FileTrainerChannel, n: int, timeout_s: float = 5.0, **kw: int) -> list[tuple[int, list]]:
    got: list[tuple[int, list]] = []
    deadline = time.monotonic() + timeout_s
    while sum(len(b) for _, b in got) < n and time.monotonic() < deadline:
        got += ch.poll(**kw)
        time.sleep(POLL / 2)
    return got


def test_only_new_segments_in_order_and_late_ranks(tmp_path: Path) -> None:
    write_segments(tmp_path, 0, 3)  # drained by a resumed trainer already: not read again
    assert shard_positions(tmp_path) == {0: 3}
    trainer, rollouts = open_pair(tmp_path, ranks=2)
    assert trainer.open_ranks == [0, 1] and rollouts[0].version == 0 and not rollouts[0].stopped
    new0 = write_segments(tmp_path, 0, 2)
    assert new0 == ["r0s3m0", "r0s3m1", "r0s4m0", "r0s4m1"]
    new1 = write_segments(tmp_path, 1, 1)  # rank 1's directory appears only now: read from its segment 0
    got = ids(poll_until(trainer, 6))
    assert got == [(0, i) for i in new0] + [(1, i) for i in new1]
    time.sleep(2 * POLL)
    assert trainer.poll() == []  # nothing new: nothing twice


def test_a_restarted_writer_continues_and_max_messages_bounds_a_poll(tmp_path: Path) -> None:
    trainer, _ = open_pair(tmp_path, ranks=1)
    first = write_segments(tmp_path, 0, 2)
    assert ids(poll_until(trainer, 4)) == [(0, i) for i in first]
    again = write_segments(tmp_path, 0, 3)  # a new writer (the rank restarted): segments 2, 3, 4
    assert again[0] == "r0s2m0"
    time.sleep(2 * POLL)
    capped = trainer.poll(max_messages=2)
    assert [len(b) for _, b in capped] == [2, 2]
    rest = trainer.poll(max_messages=2)  # right after a capped poll: not throttled
    assert ids(capped) + ids(rest) == [(0, i) for i in again]


def test_poll_is_throttled_by_the_interval(tmp_path: Path) -> None:
    run_dir = tmp_path
    trainer = FileTrainerChannel(run_dir, 1, "n", 0, poll_s=1.5, start={})
    assert trainer.poll() == []  # reads (nothing there) and starts the interval
    write_segments(run_dir, 0, 1)
    assert trainer.poll() == []  # within the interval: the filesystem is not touched
    time.sleep(1.6)
    assert len(ids(trainer.poll())) == 2


def test_notices_newest_version_then_stop_and_bye(tmp_path: Path) -> None:
    trainer, rollouts = open_pair(tmp_path, ranks=2, version=4)
    r0 = rollouts[0]
    assert r0.version == 4 and r0.poll_notices() == []  # the welcome is not queued again
    trainer.notify(5)
    trainer.notify(6)  # one file: a rank that reads after both sees the newest only
    assert r0.wait_notice(2.0) == Notice(6, False) and r0.version == 6
    assert r0.send([traj(0, 0, 0)]) == 0.0  # the segment is the message
    box: dict[str, list] = {}
    closer = threading.Thread(target=lambda: box.setdefault("late", trainer.close(timeout_s=10.0)))
    closer.start()
    for r, ch in rollouts.items():
        assert ch.wait_notice(2.0) == Notice(6, True) and ch.stopped
        last = write_segments(tmp_path, r, 1)  # the final flush, then bye
        ch.close()
        box.setdefault("expected", []).extend(last)
    closer.join(timeout=15)
    assert sorted(t.traj_id for t in box["late"]) == sorted(box["expected"])
    assert trainer.open_ranks == []


def test_close_without_a_bye_gives_up_after_its_timeout_naming_the_rank(tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    trainer, rollouts = open_pair(tmp_path, ranks=2)
    rollouts[0].close()
    written = write_segments(tmp_path, 1, 1)  # rank 1 wrote but never says bye (dead)
    with caplog.at_level(logging.WARNING, logger="agentrl.transport"):
        t0 = time.monotonic()
        late = trainer.close(timeout_s=0.3)
    assert 0.3 <= time.monotonic() - t0 < 3.0
    assert [t.traj_id for t in late] == written  # what it wrote is still returned
    assert "rollout ranks [1]" in caplog.text
    assert trainer.open_ranks == [1]


def test_trainer_open_times_out_naming_the_missing_ranks(tmp_path: Path) -> None:
    with pytest.raises(TimeoutError, match=r"rollout ranks \[1\] to join"):
        open_pair(tmp_path, ranks=2, join=(0,), timeout_s=0.5)


def test_stale_hello_and_bye_files_of_an_earlier_life_are_ignored(tmp_path: Path) -> None:
    d = tmp_path / CHANNEL_DIR
    d.mkdir()
    _write_json(d / "hello-0.json", {"nonce": "earlier", "pid": 1})
    _write_json(d / "bye-0.json", {"nonce": "earlier", "pid": 1})
    with pytest.raises(TimeoutError, match=r"rollout ranks \[0\] to join"):
        FileTrainerChannel.open(tmp_path, 1, rendezvous.publish, timeout_s=0.3, poll_s=POLL)
    rendezvous.remove(tmp_path, CHANNEL_KEY)  # that trainer is gone (the launcher clears its key)
    trainer, rollouts = open_pair(tmp_path, ranks=1)
    assert trainer.open_ranks == [0]  # the earlier life's bye does not close the new one's rank


def test_rollout_joins_only_the_notice_file_that_rendezvous_names(tmp_path: Path) -> None:
    d = tmp_path / CHANNEL_DIR
    d.mkdir()
    _write_json(d / "notice.json", {"nonce": "dead", "version": 9, "stop": True})  # a dead trainer's
    with pytest.raises(TimeoutError, match=r"rollout rank 0 waited 0.3 s for the trainer: no 'file_channel'"):
        FileRolloutChannel.connect(tmp_path, 0, rendezvous.read, timeout_s=0.3, poll_s=POLL)
    rendezvous.publish(tmp_path, **{CHANNEL_KEY: {"nonce": "alive"}})  # its notice not yet written
    with pytest.raises(TimeoutError, match=r"rollout rank 0 waited 0.3 s for the trainer: .*another life"):
        FileRolloutChannel.connect(tmp_path, 0, rendezvous.read, timeout_s=0.3, poll_s=POLL)
    trainer, rollouts = open_pair(tmp_path, ranks=1, version=2)
    assert rollouts[0].version == 2 and not rollouts[0].stopped  # the live trainer's notice, not the dead one's


def test_a_rank_of_the_previous_trainer_fails_when_the_trainer_starts_again(tmp_path: Path) -> None:
    first, rollouts = open_pair(tmp_path, ranks=1)
    rendezvous.remove(tmp_path, CHANNEL_KEY)  # what the launcher does before restarting the trainer
    second, fresh = open_pair(tmp_path, ranks=1, version=3)
    assert second.nonce != first.nonce and fresh[0].version == 3
    with pytest.raises(RuntimeError, match="rollout rank 0: the trainer started again"):
        rollouts[0].poll_notices()
