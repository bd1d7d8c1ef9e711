"""A module that became a package keeps offering the names it offered as one module, and they are the same
objects as those of the package's modules that now hold them (a re-export, never a copy).

The names listed are those each module offered when it was split (its `__all__` where it had one, else
every public name it defined).
"""
from __future__ import annotations

import importlib

import pytest

SANDBOX = ["BACKENDS", "BASE_ENV", "CAP_SYS_RESOURCE", "CHECK_ENV", "CommandResult", "DOCKER_CAPS", "DOCKER_NOFILE",
           "PYTHON_PRELUDE", "SandboxConfig", "SandboxError", "SandboxUnavailable", "Shell", "TRUSTED_PYTHON",
           "apptainer_argv", "bwrap_argv", "cgroup_support", "check_cgroups", "check_image", "check_slots",
           "has_capability", "nr_open", "pid_max", "plan_mounts", "python_argv", "seed_archive", "select_backend",
           "session_budget"]

RE_EXPORTS: dict[str, tuple[list[str], list[str]]] = {
    # the package -> (the modules its names now live in, the names it offered as one module)
    "agentrl.sandbox": (["agentrl.sandbox.shell", "agentrl.sandbox.config",
                              "agentrl.sandbox.layout"], SANDBOX),
    "agentrl.tasks.db.backends": ([f"agentrl.tasks.db.backends.{m}"
                                        for m in ("tables", "sqlite", "mariadb", "server")], [
        "ARGUMENT_PRAGMAS", "CACHE_KIB", "DENIED_FUNCTIONS", "GROUP_CONCAT_MAX", "KILL_GRACE_S", "MAX_ROWS",
        "MAX_VALUE_BYTES", "MIN_STATEMENT_S", "MYSQL8_SQL_MODE", "MariaDBDatabase", "MariaDBServer", "NO_TIME_LEFT",
        "READ_PRAGMAS", "RESULT_LIMIT", "SERVER_TEMP_BYTES", "SESSION_PRIVILEGES", "SQLITE_DBCONFIG_DEFENSIVE",
        "SQLITE_DBCONFIG_ENABLE_FTS3_TOKENIZER", "ServerAddress", "SharedAccountRefused", "SqliteDatabase",
        "TEMP_BYTES", "TEMP_LIMITS", "Table", "WATCH_PERIOD_S", "authorize", "combine_hashes", "defensive",
        "find_mariadbd", "result_text", "rows_hash", "server_temp_usage", "tables_of", "truncate"]),
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

