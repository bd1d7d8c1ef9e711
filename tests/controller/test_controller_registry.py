"""The controller's routing rule and bookkeeping, without sockets (time is passed in)."""
from __future__ import annotations

import pytest

from agentrl.serving.controller.registry import Ended, LatencyStats, Registry
from agentrl.tasks.api import EnvError
from agentrl.types import Status


def registry(*workers: tuple[str, int], tasks: tuple[str, ...] = ("lookup",)) -> Registry:
    reg = Registry()
    for wid, slots in workers:
        reg.register(wid, f"http://{wid}:1", list(tasks), slots, [], now=0.0)
    return reg


def test_pick_most_free_then_lowest_id() -> None:
    reg = registry(("w0", 4), ("w1", 8))
    picks = []
    for i in range(8):
        w = reg.pick("lookup")
        reg.add_session(f"s{i}", "lookup", w.worker_id, 0.0)
        picks.append(w.worker_id)
    assert picks == ["w1", "w1", "w1", "w1", "w0", "w1", "w0", "w1"]
    assert reg.sessions_per_task() == {"lookup": 8}


def test_pending_starts_count_as_taken() -> None:
    reg = registry(("w0", 4), ("w1", 4))
    reg.workers["w0"].pending = 1
    assert reg.pick("lookup").worker_id == "w1"


def test_errors_unknown_task_and_no_capacity() -> None:
    with pytest.raises(EnvError) as e:
        Registry().pick("lookup")
    assert e.value.code == "no_capacity"  # nobody registered yet: wait, not a typo
    reg = registry(("w0", 1))
    with pytest.raises(EnvError) as e:
        reg.pick("lokup")
    assert e.value.code == "unknown_task" and e.value.http_status == 404
    reg.add_session("s0", "lookup", "w0", 0.0)
    with pytest.raises(EnvError) as e:
        reg.pick("lookup")
    assert e.value.code == "no_capacity" and e.value.http_status == 503


def test_draining_and_dead_workers_get_no_sessions() -> None:
    reg = registry(("w0", 4), ("w1", 2))
    assert reg.heartbeat("w0", 0, True, now=1.0)
    assert reg.pick("lookup").worker_id == "w1"
    reg.mark_dead("w1", "test", now=1.0)
    with pytest.raises(EnvError):
        reg.pick("lookup")
    assert not reg.heartbeat("w1", 0, False, now=2.0)  # dead: told to register again
    assert not reg.heartbeat("nobody", 0, False, now=2.0)


def test_expire_kills_silent_workers_and_idle_sessions() -> None:
    reg = registry(("w0", 4), ("w1", 4))
    reg.add_session("a", "lookup", "w0", 0.0)
    reg.add_session("b", "lookup", "w1", 0.0)
    reg.add_session("c", "lookup", "w1", 0.0)
    reg.heartbeat("w1", 2, False, now=5.0)
    reg.sessions["c"].last_used = 5.0
    dead, idle = reg.expire(now=6.0, dead_after_s=3.0, session_idle_s=4.0, tombstone_ttl_s=100.0)
    assert dead == ["w0"] and [s.session_id for s in idle] == ["b"]
    assert set(reg.sessions) == {"c"} and reg.workers["w1"].sessions == {"c"}
    assert reg.tombstones["a"].status == Status.ENV_ERROR and "died" in reg.tombstones["a"].reason
    assert "idle" in reg.tombstones["b"].reason
    reg.expire(now=200.0, dead_after_s=1e9, session_idle_s=1e9, tombstone_ttl_s=100.0)
    assert not reg.tombstones


def test_register_adopts_drops_and_ends_lost_sessions() -> None:
    reg = registry(("w0", 4))
    reg.add_session("kept", "lookup", "w0", 0.0)
    reg.add_session("lost", "lookup", "w0", 0.0)
    reg.end_session("ended", Ended(Status.ENV_ERROR, "test", 0.0))
    drop = reg.register("w0", "http://w0:2", ["lookup"], 4,
                        [("kept", "lookup"), ("ended", "lookup"), ("new", "lookup")], now=1.0)
    assert drop == ["ended"]
    assert set(reg.sessions) == {"kept", "new"} and reg.workers["w0"].sessions == {"kept", "new"}
    assert reg.tombstones["lost"].status == Status.ENV_ERROR
    assert reg.workers["w0"].address == "http://w0:2" and reg.workers["w0"].alive


def test_latency_percentiles() -> None:
    stats = LatencyStats(window=100)
    assert stats.summary()["p50"] == 0.0
    for ms in range(1, 201):
        stats.record(float(ms))
    s = stats.summary()
    assert s["count"] == 100 and s["p50"] == pytest.approx(150.5) and s["p99"] == pytest.approx(199.01)


def test_draining_sticks_until_the_worker_registers_again() -> None:
    reg = registry(("w0", 4), ("w1", 4))
    reg.workers["w0"].draining = True  # asked of the controller; the worker has not heard yet
    assert reg.heartbeat("w0", 0, False, now=1.0)  # a beat sent before it heard must not undo it
    assert reg.workers["w0"].draining and reg.pick("lookup").worker_id == "w1"
    reg.register("w0", "http://w0:1", ["lookup"], 4, [], now=2.0)  # a fresh process: serving again
    assert not reg.workers["w0"].draining
    assert reg.register("w1", "http://w1:1", ["lookup"], 4, [], now=2.0, draining=True) == []
    assert reg.workers["w1"].draining


def test_touch_keeps_sessions_and_reports_missing_ones() -> None:
    reg = registry(("w0", 4))
    reg.add_session("a", "lookup", "w0", 0.0)
    reg.end_session("gone", Ended(Status.ENV_ERROR, "test", 0.0))
    assert reg.touch(["a", "gone", "never"], now=9.0) == ["gone", "never"]
    dead, idle = reg.expire(now=10.0, dead_after_s=1e9, session_idle_s=5.0, tombstone_ttl_s=100.0)
    assert idle == [] and "a" in reg.sessions  # touched at 9: one second idle, not ten
    _, idle = reg.expire(now=10.0, dead_after_s=1e9, session_idle_s=0.5, tombstone_ttl_s=100.0, sessions=False)
    assert idle == [] and "a" in reg.sessions  # the scan over sessions was skipped


def test_not_held_tells_a_worker_which_quiet_sessions_to_drop() -> None:
    reg = registry(("w0", 4), ("w1", 4))
    reg.add_session("mine", "lookup", "w0", 0.0)
    reg.add_session("theirs", "lookup", "w1", 0.0)
    assert reg.not_held("w0", ["mine", "theirs", "forgotten"]) == ["theirs", "forgotten"]


def test_a_suspect_worker_gets_new_sessions_only_when_no_other_has_room() -> None:
    reg = registry(("w0", 8), ("w1", 2))
    reg.workers["w0"].failures = 1  # its last call timed out
    assert reg.pick("lookup").worker_id == "w1"
    reg.add_session("a", "lookup", "w1", 0.0)
    reg.add_session("b", "lookup", "w1", 0.0)
    assert reg.pick("lookup").worker_id == "w0"  # better a suspect than no session at all
    reg.workers["w0"].failures = 0  # a good answer since
    reg.end_session("a")
    assert reg.pick("lookup").worker_id == "w0"
