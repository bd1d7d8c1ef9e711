"""A local run is bounded by `cluster.time_limit_s` (0: none), not by `cluster.role_timeout_s`, which bounds each
wait of one role for another: a multi-task run on 2 cores was stopped by the launcher after exactly the hour of
role_timeout_s, in its first RL step, with every role still working."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from agentrl.config import ConfigError, load_config
from agentrl.launch.local import LocalLauncher


def test_the_launcher_waits_without_a_limit_and_stops_at_one(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path)
    try:
        launcher.start_command("a", ["sh", "-c", "sleep 1.5"])
        assert launcher.watch(["a"], math.inf, poll_s=0.05) is None  # no limit: it waits for the role to end
        launcher.start_command("b", ["sh", "-c", "sleep 30"])
        with pytest.raises(TimeoutError, match=r"roles \['b'\] still running after 1s"):
            launcher.watch(["b"], 1.0, poll_s=0.05)
    finally:
        launcher.stop_all(grace_s=1.0)


def test_the_runs_time_limit_is_its_own_setting() -> None:
    cfg = load_config("smoke")
    assert cfg.cluster.time_limit_s == 0.0 and cfg.cluster.role_timeout_s == 3600.0
    assert load_config("smoke", ["cluster.time_limit_s=7200"]).cluster.time_limit_s == 7200.0
    with pytest.raises(ConfigError, match="cluster.time_limit_s"):
        load_config("smoke", ["cluster.time_limit_s=-1"])
