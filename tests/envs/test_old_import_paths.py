"""Every module path users and task authors imported before envs/ was split by layer still imports, and
gives the same objects as the modules that now hold them (a re-export, never a copy).

The names listed are those each old module offered at the split (its `__all__` where it had one, else
every public name it defined).
"""
from __future__ import annotations

import importlib

import pytest

API = ["AGENT_FAULTS", "ERROR_HTTP_STATUS", "MAX_ARGUMENT_BYTES", "MAX_OUTPUT_CHARS", "MAX_TOOL_CALLS",
       "MESSAGE_BUDGET_S", "SHOWN_CHARS", "Action", "AnswersInText", "BudgetExceeded", "Closable", "EnvError",
       "Episode", "HasOwnTools", "InteractResult", "Session", "StartResult", "StepResult", "Task", "ToolBox",
       "ToolCall", "agent_fault", "cut", "message_budget", "message_deadline", "over_budget", "require", "shown",
       "time_left", "tool_message", "truncate_messages"]
SANDBOX = ["BACKENDS", "BASE_ENV", "CAP_SYS_RESOURCE", "CHECK_ENV", "CommandResult", "DOCKER_CAPS", "DOCKER_NOFILE",
           "PYTHON_PRELUDE", "SandboxConfig", "SandboxError", "SandboxUnavailable", "Shell", "TRUSTED_PYTHON",
           "apptainer_argv", "bwrap_argv", "cgroup_support", "check_cgroups", "check_image", "check_slots",
           "has_capability", "nr_open", "pid_max", "plan_mounts", "python_argv", "seed_archive", "select_backend",
           "session_budget"]

RE_EXPORTS: dict[str, tuple[list[str], list[str]]] = {
    # old module -> (the modules its names now live in, the names it offered)
    "agentrl.envs.api": (["agentrl.envs.task", "agentrl.envs.session", "agentrl.envs.wire_types"], API),
    "agentrl.envs.sandbox": (["agentrl.envs.sandbox.shell", "agentrl.envs.sandbox.config",
                              "agentrl.envs.sandbox.layout"], SANDBOX),
    "agentrl.envs.contract": (["agentrl.envs.checks.contract"], [
        "ContractError", "ContractReport", "TOOL_NAME", "check_indices", "check_malformed", "check_protocol",
        "check_task", "check_tools", "malformed_moves", "play_expert"]),
    "agentrl.envs.expert": (["agentrl.envs.checks.expert"], ["play"]),
    "agentrl.envs.expert_report": (["agentrl.envs.checks.expert_report"], [
        "SplitReport", "expert_reports", "report_json", "report_split", "task_options"]),
    "agentrl.envs.attacks": (["agentrl.envs.checks.attacks"], ["Attack", "AttackResult", "attacks_for",
                                                               "play_attacks"]),
    "agentrl.envs.tasks.db.backends": ([f"agentrl.envs.tasks.db.backends.{m}"
                                        for m in ("tables", "sqlite", "mariadb", "server")], [
        "ARGUMENT_PRAGMAS", "CACHE_KIB", "DENIED_FUNCTIONS", "GROUP_CONCAT_MAX", "KILL_GRACE_S", "MAX_ROWS",
        "MAX_VALUE_BYTES", "MIN_STATEMENT_S", "MYSQL8_SQL_MODE", "MariaDBDatabase", "MariaDBServer", "NO_TIME_LEFT",
        "READ_PRAGMAS", "RESULT_LIMIT", "SERVER_TEMP_BYTES", "SESSION_PRIVILEGES", "SQLITE_DBCONFIG_DEFENSIVE",
        "SQLITE_DBCONFIG_ENABLE_FTS3_TOKENIZER", "ServerAddress", "SharedAccountRefused", "SqliteDatabase",
        "TEMP_BYTES", "TEMP_LIMITS", "Table", "WATCH_PERIOD_S", "authorize", "combine_hashes", "defensive",
        "find_mariadbd", "result_text", "rows_hash", "server_temp_usage", "tables_of", "truncate"]),
    "agentrl.envs.replay": (["agentrl.envs.checks.replay"], [
        "DATA", "HOST", "NETWORK", "NETWORK_COMMANDS", "OURS", "Outcome", "build", "check", "replay_db", "replay_os",
        "run_checks"]),
}

SAME_MODULE: dict[str, str] = {
    # old module path -> the module it now is (one object under both names)
    **{f"agentrl.envs.attacks.{m}": f"agentrl.envs.checks.attacks.{m}"
       for m in ("flood", "flooder", "library", "resources", "runner")},
    **{f"agentrl.envs.replay.{m}": f"agentrl.envs.checks.replay.{m}"
       for m in ("classes", "db_replay", "os_replay", "suite")},
}


@pytest.mark.parametrize("old", sorted(RE_EXPORTS))
def test_old_module_gives_the_same_objects(old: str) -> None:
    module = importlib.import_module(old)
    homes, names = RE_EXPORTS[old]
    homes_mods = [importlib.import_module(m) for m in homes]
    for name in names:
        assert hasattr(module, name), f"{old} no longer offers {name}"
        found = [vars(h)[name] for h in homes_mods if name in vars(h)]
        assert found, f"{name} of {old} is in none of {homes}"
        assert all(getattr(module, name) is f for f in found), f"{old}.{name} is a copy, not the object itself"


@pytest.mark.parametrize("old", sorted(SAME_MODULE))
def test_old_module_path_is_the_new_module(old: str) -> None:
    assert importlib.import_module(old) is importlib.import_module(SAME_MODULE[old])
