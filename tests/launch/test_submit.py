"""agentrl.launch.submit without a cluster: Slurm times to submitit's minutes (the rest: test_slurm_cluster)."""
from __future__ import annotations

import pytest

from agentrl.launch.submit import _time_minutes


@pytest.mark.parametrize("text,minutes", [("30", 30), ("01:00:00", 60), ("2-00:00:00", 2880), ("00:10:30", 11)])
def test_time_minutes(text: str, minutes: int) -> None:
    assert _time_minutes(text) == minutes
