"""The pieces a continued run relies on, without starting one (tests/e2e/test_async_resume.py does that):
which runs may be continued with which options, the rendezvous keys cleared before the pipeline restarts,
and the rollout rank's incarnation counter."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from agentrl.config import dump_config, load_config
from agentrl.launch import rendezvous
from agentrl.launch.continuing import resume_check
from agentrl.launch.local import PIPELINE_KEYS
from agentrl.rollout.role import next_incarnation
from agentrl.rollout.weight_sources import STORE_KEY
from agentrl.transport.file_channel import CHANNEL_KEY

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, *overrides: str) -> Path:
    dump_config(load_config("smoke", list(overrides)), tmp_path / "config.yaml")
    return tmp_path


def test_resume_check_names_what_differs(tmp_path: Path) -> None:
    run = _run(tmp_path, "cluster.schedule=async", "trainer.lr=1e-5")
    same = load_config("smoke", ["cluster.schedule=async", "trainer.lr=1e-5"])
    assert resume_check(run, same) is None
    longer = load_config("smoke", ["cluster.schedule=async", "trainer.lr=1e-5", "trainer.steps=50"])
    assert resume_check(run, longer) is None  # more steps extend the run
    roomier = load_config("smoke", ["cluster.schedule=async", "trainer.lr=1e-5", "cluster.rollout.kv_cache_gib=3"])
    assert resume_check(run, roomier) is None  # how many episodes fit in the KV cache, not what they sample
    other = load_config("smoke", ["cluster.schedule=async", "trainer.lr=2e-5", "seed=3"])
    why = resume_check(run, other)
    assert why is not None and "trainer.lr" in why and "seed" in why and "trainer.steps" not in why


def test_a_synchronous_run_continues_like_any_other(tmp_path: Path) -> None:
    """One pipeline: a synchronous run resumes as an asynchronous one does (it used to be refused, and its
    requeued rollout waited for weights/v0, pruned long before); switching the schedule is a different run."""
    run = _run(tmp_path)  # the smoke preset: the synchronous schedule
    assert resume_check(run, load_config("smoke")) is None
    why = resume_check(run, load_config("smoke", ["cluster.schedule=async"]))
    assert why is not None and "cluster.schedule ('sync' -> 'async')" in why


def test_pipeline_keys_are_the_ones_the_pipeline_publishes(tmp_path: Path) -> None:
    assert set(PIPELINE_KEYS) == {"mpi_port", STORE_KEY, CHANNEL_KEY}  # "mpi_port": earlier versions' run dirs
    rendezvous.publish(tmp_path, controller_url="http://x", **{k: {"port": 1} for k in PIPELINE_KEYS})
    rendezvous.remove(tmp_path, *PIPELINE_KEYS)
    assert rendezvous.read(tmp_path) == {"controller_url": "http://x"}
    rendezvous.remove(tmp_path, "absent")  # nothing to do
    assert rendezvous.read(tmp_path) == {"controller_url": "http://x"}


def test_clear_pipeline_from_the_command_line(tmp_path: Path) -> None:
    """What the rendered async script runs before it starts a dead MPI world again: the pipeline's keys go,
    the controller's address stays."""
    rendezvous.publish(tmp_path, controller_url="http://x", mpi_port="tag#0", weights_store={"port": 1})
    cmd = [sys.executable, "-m", "jobs.launch", "--clear-pipeline", str(tmp_path)]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert rendezvous.read(tmp_path) == {"controller_url": "http://x"}
    assert f"cleared the pipeline's rendezvous keys in {tmp_path}: mpi_port, weights_store" in out.stdout
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "none were there" in again.stdout
    assert rendezvous.read(tmp_path) == {"controller_url": "http://x"}


def test_incarnations_count_up_per_directory(tmp_path: Path) -> None:
    assert [next_incarnation(tmp_path / "r0") for _ in range(3)] == [0, 1, 2]
    assert next_incarnation(tmp_path / "r1") == 0
    assert (tmp_path / "r0" / "incarnation").read_text() == "2"
