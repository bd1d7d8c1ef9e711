"""Apptainer command lines (golden) and the clear error where a config asks for Apptainer and the node has none.

No Apptainer binary exists on these machines (../shared/platform.md): the commands are checked as text,
and bubblewrap stays the sandbox that the env tests really run.
"""
from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.launch import apptainer, rendezvous
from agentrl.launch.prepare import prepare_run, run_config
from agentrl.sandbox import apptainer_argv

GOLDEN = Path(__file__).parent / "golden"
REGEN = os.environ.get("AGENTRL_REGEN_GOLDEN") == "1"


def check(name: str, argv: list[str]) -> None:
    text = shlex.join(argv) + "\n"
    if REGEN:
        (GOLDEN / name).write_text(text)
    assert text == (GOLDEN / name).read_text(), f"{name} differs (AGENTRL_REGEN_GOLDEN=1 rewrites it)"


def test_worker_command_golden() -> None:
    argv = apptainer.worker_command("/images/agentrl.sif", "runs/x-42", "data",
                                    ["python", "-m", "jobs.env_worker", "--run-dir", "runs/x-42"],
                                    ("/scratch/agentbench",))
    check("apptainer-worker.txt", argv)
    assert argv[:4] == ["apptainer", "exec", "--containall", "--cleanenv"]
    assert argv[argv.index("/images/agentrl.sif") - 6:argv.index("/images/agentrl.sif")] == [
        "--bind", "runs/x-42", "--bind", "data", "--bind", "/scratch/agentbench"]


def test_os_sandbox_command_golden() -> None:
    """The per-session sandbox of the `os` task (agentrl/sandbox/): contained, no network."""
    argv = apptainer_argv("/images/os-sandbox.sif", {"/run/s1/root": "/root", "/run/s1/tmp": "/tmp"},
                          {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, ["bash", "-c", "driver"], "agentrl-sandbox")
    check("apptainer-os-sandbox.txt", argv)
    assert argv[2:7] == ["--containall", "--no-init", "--net", "--network", "none"]


def test_launcher_passes_the_os_sandbox_image(tmp_path: Path) -> None:
    cfg = run_config("smoke", ["envs.tasks=[os]", "cluster.env.os_sandbox_image=/images/os-sandbox.sif",
                               "envs.task_options={os: {sandbox: {fakeroot: false}}}"], tmp_path / "r1")
    assert cfg.envs.task_options["os"]["sandbox"] == {"fakeroot": False, "backend": "apptainer",
                                                      "image": "/images/os-sandbox.sif"}
    assert (cfg.name, cfg.run_root) == ("r1", str(tmp_path))
    untouched = run_config("smoke", ["cluster.env.os_sandbox_image=/images/os-sandbox.sif"], tmp_path / "r2")
    assert untouched.envs.task_options == {}  # no os task, nothing to pass


def test_missing_apptainer_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(apptainer.ApptainerMissing, match=r"cluster.env.apptainer_image asks for Apptainer"):
        prepare_run("smoke", ["cluster.env.apptainer_image=/images/agentrl.sif"], tmp_path / "run")
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_apptainer_found_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "singularity"  # the alias many clusters provide
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert apptainer.require_apptainer("cluster.env.apptainer_image") == str(fake)


def test_prepare_run_keeps_a_requeued_run(tmp_path: Path) -> None:
    cfg, resumed = prepare_run("smoke", ["trainer.steps=3"], tmp_path / "run")
    assert not resumed and cfg.trainer.steps == 3
    rendezvous.publish(tmp_path / "run", controller_url="http://n3:41234")  # the first attempt's controller
    again, resumed = prepare_run("smoke", ["trainer.steps=7"], tmp_path / "run")  # a requeue: same dir
    assert resumed and again.trainer.steps == 3
    assert rendezvous.read(tmp_path / "run") == {}  # its addresses are dead: the roles wait for new ones
    assert again == load_config(str(tmp_path / "run" / "config.yaml"))
