"""The network floods of `jobs.attack_check` (`agentrl.checks.attacks.flood`): a controller and a worker
process, each flooded with 1,100 connections from another process for a few seconds per flood, while the
run's own client plays episodes through the controller. On 5d8debb (aiohttp's own listener) half-sent heads
held their sockets for as long as the flood ran (and with 1,024 descriptors the controller stopped
accepting: the run's calls took 5 s and more), and 512 KB heads took the run's calls past 13 s."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_floods_without_the_secret_cost_the_run_nothing() -> None:
    # all six: the head deadline (half_head, idle), a head still trickling at its deadline (drip_head), the
    # bound on a head's bytes before the secret (huge_head), refusals churned as fast as the flooder can
    # (wrong_secret, slow_body); 4 s each, past the 2 s head deadline and its 1.5 s slack
    out = subprocess.run([sys.executable, "-m", "jobs.attack_check", "--tasks", "http", "--flood-seconds", "4",
                          "--only", "_", "-v"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("flood_")]
    assert out.returncode == 0 and len(lines) == 6, out.stdout + out.stderr[-3000:]
    assert all(" HELD " in line for line in lines), out.stdout
