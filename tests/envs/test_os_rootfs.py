"""The os sandbox's root file system (agentrl/envs/sandbox/rootfs.py, jobs/make_rootfs.py): where it lives,
the mirror and command line that build it, the checks a task runs before using it, and the per-task
session budget. Building it for real is `.ci/run`'s job (minutes, network); the image it built is
checked here when present."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from sandbox_helpers import require_sandbox

from agentrl.envs.sandbox import rootfs
from agentrl.envs.tasks.os_task import SessionBudget


def test_mirror_comes_from_apts_own_sources(tmp_path: Path) -> None:
    d = tmp_path / "sources.list.d"
    d.mkdir()
    (d / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n")
    assert rootfs.apt_mirror(d, tmp_path / "none") == "http://mirror.example/debian"
    (d / "debian.sources").unlink()
    (tmp_path / "sources.list").write_text("deb [arch=amd64] http://old.example/debian bookworm main\n")
    assert rootfs.apt_mirror(d, tmp_path / "sources.list") == "http://old.example/debian"
    assert rootfs.apt_mirror(tmp_path / "no", tmp_path / "no") == rootfs.DEFAULT_MIRROR


def test_debootstrap_command_line() -> None:
    argv = rootfs.debootstrap_argv("/x/img", "http://m/debian")
    assert argv[:2] == ["debootstrap", "--variant=minbase"] and argv[-3:] == ["bookworm", "/x/img", "http://m/debian"]
    included = argv[2].removeprefix("--include=").split(",")
    assert {"python3", "procps", "gawk", "tree", "unzip"} <= set(included)


def test_location_and_missing_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRL_ROOTFS_DIR", str(tmp_path / "img"))
    assert rootfs.default_rootfs_dir() == tmp_path / "img"
    monkeypatch.delenv("AGENTRL_ROOTFS_DIR")
    expected = Path("/var/cache/agentrl/rootfs/os-bookworm") if os.geteuid() == 0 else \
        Path.home() / ".cache/agentrl/rootfs/os-bookworm"
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert rootfs.default_rootfs_dir() == expected
    with pytest.raises(FileNotFoundError, match=r"build it with `python -m jobs.make_rootfs --out"):
        rootfs.require_rootfs(tmp_path / "img")
    half = tmp_path / "half"  # an interrupted build has no stamp
    (half / "usr/bin").mkdir(parents=True)
    (half / "usr/bin/bash").write_text("")
    (half / "usr/bin/python3").write_text("")
    assert not rootfs.is_rootfs(half)
    (half / rootfs.STAMP).write_text("done")
    assert rootfs.is_rootfs(half)  # also an image of before 2026-12-02 (its grader tools are hidden in sessions)
    assert rootfs.build_rootfs(half) == (half, 0.0)  # nothing to do: no debootstrap, no root needed
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (half).rename(private / "img")
    if os.geteuid() == 0:  # the sandbox's uid cannot enter a 0700 directory
        with pytest.raises(PermissionError, match="cannot enter"):
            rootfs.require_rootfs(private / "img", uid=65534)


def test_the_built_image() -> None:
    require_sandbox()
    image = rootfs.default_rootfs_dir()
    assert rootfs.is_rootfs(image) and (image / "etc/ld.so.preload").read_text() == ""
    assert (image / "etc/hostname").read_text() == "agentrl-sandbox\n"
    setuid = [p for p in (image / "usr/bin").iterdir() if not p.is_symlink() and p.stat().st_mode & 0o6000]
    assert setuid == []


def test_session_budget() -> None:
    budget = SessionBudget(2)
    assert (budget.acquire(), budget.acquire()) == (0, 1)  # each live session its own slot (its uid range)
    with pytest.raises(RuntimeError, match="2 sandboxes are live, the host's process budget allows 2"):
        budget.acquire()
    budget.release(0)
    assert budget.acquire() == 0
    assert budget.live == 2


def test_a_worker_refuses_more_sandbox_slots_than_the_hosts_pids_allow() -> None:
    """start_worker runs the task's own budget check before serving: no half-started worker."""
    import asyncio

    from agentrl.config import ControllerConfig, EnvsConfig
    from agentrl.envs.worker import start_worker

    class Budgeted:  # the os task's check_slots contract, without a sandbox: 10 slots at most
        name, max_turns = "budgeted", 1

        def check_slots(self, slots: int) -> None:
            if slots > 10:
                raise ValueError(f"{slots} sandbox slots exceed this host's budget of 10")

    async def go(slots: int) -> None:
        running = await start_worker(EnvsConfig(tasks=("budgeted",), slots=slots), ControllerConfig(),
                                     "http://127.0.0.1:9", "w", tasks={"budgeted": Budgeted()})  # type: ignore[dict-item]
        await running.stop()

    with pytest.raises(ValueError, match="budget of 10"):
        asyncio.run(go(11))
