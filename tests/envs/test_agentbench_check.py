"""`jobs.agentbench_check`'s os replay (the os task's expert, through its public Task API) and its
failure classes, on this project's os samples."""
from __future__ import annotations

import shutil

import pytest

from agentrl.envs.tasks import get_task
from jobs.agentbench_check import NETWORK_COMMANDS, check, replay_os


def test_network_commands_are_recognised() -> None:
    assert NETWORK_COMMANDS.search("apt-get install -y jq") and NETWORK_COMMANDS.search("pip install x")
    assert not NETWORK_COMMANDS.search("grep -c apple fruits.txt")


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the os task's sandbox needs bubblewrap")
def test_os_examples_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTRL_AGENTBENCH_DIR", raising=False)  # this project's samples
    result = check(get_task("os"), "test", replay_os, limit=2, workers=1)
    assert (result["passed"], result["total"], result["failures"]) == (2, 2, {}), result["details"]
