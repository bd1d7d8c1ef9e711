"""The os sandbox's root file system (agentrl/sandbox/rootfs.py, jobs/make_rootfs.py): where it lives,
the mirror and command line that build it, the checks a task runs before using it, and the per-task
session budget. Building it for real is `.ci/run`'s job (minutes, network); the image it built is
checked here when present."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from sandbox_helpers import require_sandbox

from agentrl.sandbox import rootfs
from agentrl.tasks.os_task import SessionBudget


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
    with pytest.raises(RuntimeError, match="2 sandboxes are live, the host's tables allow 2"):
        budget.acquire()
    budget.release(0)
    assert budget.acquire() == 0
    assert budget.live == 2


def test_a_worker_caps_a_task_the_host_holds_fewer_sessions_of() -> None:
    """start_worker asks each task how many sessions the host holds (`session_cap`): more slots than that start a
    worker whose starts of that task past the cap answer no_capacity (the client waits), while the other tasks
    keep every slot; a cap of 0 refuses to start, no half-started worker."""
    import asyncio

    from agentrl.config import ControllerConfig, EnvsConfig
    from agentrl.serving.worker import EnvWorker, start_worker
    from agentrl.tasks.api import EnvError
    from agentrl.tasks.echo import EchoTask

    class Budgeted(EchoTask):  # the os task's session_cap contract, without a sandbox
        name = "budgeted"

        def __init__(self, cap: int) -> None:
            self.cap = cap

        def session_cap(self) -> int:
            return self.cap

        def session_cap_why(self) -> str:
            return f"a budget of {self.cap}"

    async def go(cap: int) -> None:
        running = await start_worker(EnvsConfig(tasks=("budgeted",), slots=4), ControllerConfig(),
                                     "http://127.0.0.1:9", "w", tasks={"budgeted": Budgeted(cap)})  # type: ignore[dict-item]
        await running.stop()

    with pytest.raises(ValueError, match="a budget of 0"):
        asyncio.run(go(0))

    class Req:  # the one thing start_sample reads of its request, through `_body`
        def __init__(self, body: dict) -> None:
            self.body = body

    async def starts() -> list[str]:
        worker = EnvWorker({"budgeted": Budgeted(2), "echo": EchoTask()}, EnvsConfig(slots=4), ControllerConfig(), "w")
        worker._body = lambda request: asyncio.sleep(0, request.body)  # type: ignore[method-assign]
        seen = []
        for task in ("budgeted", "budgeted", "budgeted", "echo", "echo"):
            try:
                await worker.start_sample(Req({"task": task, "index": "train-0"}))  # type: ignore[arg-type]
                seen.append(f"{task} ok")
            except EnvError as e:
                seen.append(f"{task} {e.code}")
        worker.shutdown()
        return seen

    assert asyncio.run(starts()) == ["budgeted ok", "budgeted ok", "budgeted no_capacity", "echo ok", "echo ok"]
