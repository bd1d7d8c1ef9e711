"""The MPI channel over a real MPI (the `mpich` wheel's mpiexec): an MPMD world of 1 trainer + 2 rollout
ranks, a rank that joins late, back-pressure, timeouts that name the missing peer, and close's timeouts.

The ranks are the programs in `mpi_roles.py`. Without mpiexec or mpi4py these tests skip, except in CI
(CI=true), where that absence is a failure: MPI is part of the default install.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.transport.mpi_roles import ARRAYS, batches

REPO = Path(__file__).resolve().parents[2]
ROLES = str(REPO / "tests" / "transport" / "mpi_roles.py")
MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")


def _require_mpi() -> None:
    missing = [what for what, ok in (("mpiexec", MPIEXEC), ("mpi4py", importlib.util.find_spec("mpi4py"))) if not ok]
    if missing:
        reason = f"{' and '.join(missing)} not installed (install.sh installs the mpich wheel and mpi4py)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the MPI tests: {reason}")
        pytest.skip(reason)


@pytest.fixture
def mpirun() -> Iterator:
    """Starts `mpiexec` commands in their own process groups; kills every group left at teardown."""
    _require_mpi()
    procs: list[subprocess.Popen[str]] = []
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1"}

    def start(*apps: list[str]) -> subprocess.Popen[str]:
        cmd = [MPIEXEC]
        for i, app in enumerate(apps):
            cmd += ([":"] if i else []) + ["-n", app[0], sys.executable, "-m", "mpi4py", ROLES, *app[1:]]
        p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def finish(p: subprocess.Popen[str], timeout_s: float = 30.0) -> tuple[int, str]:
    out, _ = p.communicate(timeout=timeout_s)
    return p.returncode, out


def check_round_trip(out: Path, num_rollout: int) -> None:
    """Every trajectory of every rollout rank arrived once, equal in every field, with the schema dtypes;
    every rollout rank saw the welcome (version 7), the notices 8 and 9, then the stop."""
    got = json.loads((out / "trainer.json").read_text())
    assert got["open"] == [] and got["late"] == 0
    for r in range(num_rollout):
        mine = [g for g in got["received"] if g["rank"] == r]
        want = [t.to_dict() for b in batches(r) for t in b]
        assert [g["traj"] for g in mine] == want  # in send order, every field exactly (reward too)
        assert all(g["dtypes"] == [str(np.dtype(d)) for d in ("int32", "uint8", "float32", "int32", "int16")]
                   for g in mine), ARRAYS
        assert any(t["engine"] and max(t["engine"]) > 0 for t in want)  # the engine/version arrays carry data
        seen = json.loads((out / f"rollout-{r}.json").read_text())
        assert seen == {"first_version": 7, "notices": [[8, False], [9, False], [9, True]], "version": 9}
    assert len(got["received"]) == sum(len(b) for r in range(num_rollout) for b in batches(r))


def test_mpmd_world_one_trainer_two_rollout_ranks(mpirun, tmp_path: Path) -> None:
    t0 = time.monotonic()
    p = mpirun(["1", "world-trainer", str(tmp_path), "2", "20"], ["2", "world-rollout", str(tmp_path), "20"])
    rc, log = finish(p)
    assert rc == 0, log
    check_round_trip(tmp_path, 2)
    assert time.monotonic() - t0 < 20


def test_late_rollout_rank_joins_a_running_trainer(mpirun, tmp_path: Path) -> None:
    """The trainer waits for one rank at start; the other's hello is answered by `poll` mid-run."""
    p = mpirun(["1", "world-trainer", str(tmp_path), "1", "20", "2"], ["2", "world-rollout", str(tmp_path), "20"])
    rc, log = finish(p)
    assert rc == 0, log
    check_round_trip(tmp_path, 2)
    assert len(json.loads((tmp_path / "trainer.json").read_text())["initial"]) == 1


def test_backpressure_and_idle_polling(mpirun, tmp_path: Path) -> None:
    """A trainer that stops receiving blocks the rollout rank's sends (3 MB messages, max_pending=2),
    and waiting for messages costs little CPU (Improbe + sleep, not a spinning blocking Recv)."""
    p = mpirun(["1", "bp-trainer", str(tmp_path), "1.5"], ["1", "bp-rollout", str(tmp_path)])
    rc, log = finish(p)
    assert rc == 0, log
    trainer = json.loads((tmp_path / "trainer.json").read_text())
    rollout = json.loads((tmp_path / "rollout-0.json").read_text())
    assert trainer["received"] == 6
    assert 1.0 < rollout["waited_s"] < 10.0  # blocked about the 1.5 s the trainer did not receive
    assert trainer["idle_cpu_s"] < 0.3  # over 1 s of polling; a blocking Recv would burn about 1.0


def test_trainer_timeout_names_the_missing_rollout_rank(mpirun, tmp_path: Path) -> None:
    t0 = time.monotonic()
    p = mpirun(["1", "world-trainer", str(tmp_path), "2", "2"], ["1", "world-rollout", str(tmp_path), "20"])
    rc, log = finish(p)
    assert rc != 0
    assert "trainer waited 2 s for rollout ranks [1] in the MPI world; joined: [0]" in log
    assert time.monotonic() - t0 < 15  # python -m mpi4py aborts the world: the rollout rank does not hang


def test_rollout_timeout_names_the_trainer(mpirun, tmp_path: Path) -> None:
    t0 = time.monotonic()
    p = mpirun(["1", "idle", str(tmp_path), "30"], ["1", "world-rollout", str(tmp_path), "1"])  # rank 0 never answers
    rc, log = finish(p)
    assert rc != 0 and "rollout rank 0 waited 1 s for the trainer (world rank 0)" in log
    assert time.monotonic() - t0 < 15  # the abort ends the idle rank too


def test_close_timeouts_warn_and_return_on_both_ends(mpirun, tmp_path: Path) -> None:
    """The channel contract's close: the trainer's close returns after its timeout with what arrived, the
    late rank still open and named in a warning; the rollout rank's close, unanswered, warns and returns."""
    p = mpirun(["1", "close-trainer", str(tmp_path)], ["1", "close-rollout", str(tmp_path)])
    rc, log = finish(p)
    assert rc == 0, log
    trainer = json.loads((tmp_path / "trainer.json").read_text())
    rollout = json.loads((tmp_path / "rollout-0.json").read_text())
    assert trainer["late"] == len(batches(0)[0]) and trainer["open"] == [0]
    assert 0.9 < trainer["close_s"] < 5.0
    assert trainer["warnings"] == ["trainer waited 1 s for rollout ranks [0] to close; going on without them"]
    assert 0.9 < rollout["close_s"] < 5.0
    assert rollout["warnings"] == ["rollout rank 0 waited 1 s for the trainer (no answer to bye) to close; "
                                   "going on without them"]


def test_import_initializes_no_mpi() -> None:
    code = ("import sys, agentrl.transport, agentrl.transport.mpi_channel as m; "
            "assert 'mpi4py' not in sys.modules, 'mpi4py imported'; print(m.TAG_TRAJ)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0 and out.stdout.strip() == "11", out.stderr


def test_missing_mpi_skips_locally_but_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "MPIEXEC", None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must run the MPI tests: mpiexec not installed"):
        _require_mpi()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="mpiexec not installed"):
        _require_mpi()
