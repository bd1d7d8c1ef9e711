"""The dependency directions of docs/architecture.md §2, checked over the package's imports (AST, no execution).

Roles meet only at wire formats: rollout never imports trainer or controller, trainer never imports
rollout/serving/tasks, algorithms stay pure math, launch runs on a login node without torch or vLLM,
and nothing imports the `jobs/` entry points: not the package, not another entry point (code two
jobs share belongs in `agentrl/`), and not a test (tests call the library; a test of a command line runs
it, `python -m jobs.x`, in a subprocess). `agentrl/auth.py` (the run's secret) is standard library only, so
every role, the launcher included, may use it. The tasks (`agentrl.tasks`) import nothing of the serving
layer (`agentrl.serving`) or the checks (`agentrl.checks`); the rollout learns task names from the config,
never by importing the tasks. In the whole package imports flow one way: no module imports, even inside a
function, a module that imports it back (0 circles). And its files stay small: none over `MAX_LINES`.
"""
from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "agentrl"
JOBS = ROOT / "jobs"

# module (subpackage or top-level file) -> agentrl modules it may import; "*" = anything third-party
ALLOWED: dict[str, set[str]] = {
    "types": set(),
    # the loader checks each task's options against the dataclass it declares (agentrl.tasks.options_type); the
    # task packages import no config
    "config": {"tasks"},
    "auth": set(),
    "fsio": set(),
    "reaper": set(),
    "run_files": set(),
    "algorithms": {"types"},
    # the task author's API and the built-in tasks: the os task runs on the sandbox; nothing of serving or the checks
    "tasks": {"sandbox", "types", "reaper"},
    # the os task's runtime: a package of its own, on the standard library
    "sandbox": set(),
    # sessions, the env worker and its isolation, the wire, the clients, the controller
    "serving": {"tasks", "types", "config", "auth", "fsio", "reaper"},
    # tools that check tasks, the servers and the agent loop (run from jobs/ and the tests, never by a role)
    "checks": {"tasks", "sandbox", "serving", "rollout", "types", "config", "auth", "fsio"},
    # the one staleness rule (algorithms.staleness) is what the queue, the rank's admission and the planner apply
    "transport": {"algorithms", "types", "config", "fsio"},
    "monitor": {"types", "config", "fsio"},
    # the tiny policy's tokenizer is trained on the tasks' expert episodes (models.tiny_policy); no role imports models
    "models": {"tasks", "serving", "types", "config", "fsio"},
    # the rollout reaches the tasks through the serving layer's client; of `tasks` it reads the API's error type and
    # the bounded JSON reader only (`test_the_rollout_never_imports_the_tasks`)
    "rollout": {"algorithms", "serving", "tasks", "transport", "monitor", "types", "config", "auth", "fsio"},
    "trainer": {"algorithms", "transport", "monitor", "types", "config", "fsio", "run_files"},
    "launch": {"config", "auth", "fsio", "reaper", "run_files"},
    # evaluation plays episodes as the rollout does (engines, the model's format, the env client) and starts env
    # services the way the local launcher does; it never imports the trainer
    "evaluation": {"rollout", "serving", "tasks", "monitor", "launch", "transport", "types", "config", "auth", "fsio"},
    # what the jobs/bench_*.py entry points measure; the planner reads a run's TensorBoard scalars (monitor)
    "bench": {"trainer", "algorithms", "monitor", "types", "config", "fsio"},
}
NARROW: dict[str, dict[str, set[str]]] = {
    # a rank reaches the env side through the env client (or its in-process twin): never the controller,
    # the worker or a session
    "rollout": {"serving": {"agentrl.serving.client", "agentrl.serving.inprocess", "agentrl.serving.wire_types"}},
}
"""Where a subpackage may import only some modules of one it is allowed."""
# third-party modules a subpackage must never import
FORBIDDEN_THIRD_PARTY: dict[str, set[str]] = {
    "algorithms": {"torch.distributed", "mpi4py", "vllm", "h5py", "aiohttp"},
    "launch": {"torch", "vllm", "mpi4py", "transformers", "h5py"},
    "types": {"torch", "vllm"},
    "config": {"torch", "vllm"},
    "tasks": {"torch", "vllm", "aiohttp"},
    "sandbox": {"torch", "vllm", "aiohttp"},
    "serving": {"torch", "vllm", "transformers"},
}
STDLIB_ONLY = {"auth", "fsio", "reaper", "run_files"}
"""Modules that import nothing outside the standard library (the launcher's login node has little)."""


def _owner(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0].removesuffix(".py")


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            raise AssertionError(f"{path}: use absolute imports (agentrl.x), not relative ones")
    return out


FILES = sorted(p for p in PKG.rglob("*.py"))


def test_every_module_has_a_rule() -> None:
    owners = {_owner(p) for p in FILES if p.name != "__init__.py" or p.parent != PKG}
    assert owners <= set(ALLOWED), f"no dependency rule for {owners - set(ALLOWED)}"


def _violations(owner: str, modules: list[str]) -> list[str]:
    """The imports among `modules` that a module of `owner` may not make."""
    bad = []
    for mod in modules:
        parts = mod.split(".")
        if parts[0] == "jobs":
            bad.append(f"imports the entry points ({mod})")
        elif parts[0] == "agentrl":
            target = parts[1] if len(parts) > 1 else ""
            if not target:
                bad.append("imports the package root; import a module")
            elif target != owner and target not in ALLOWED[owner]:
                bad.append(f"{owner} must not import agentrl.{target} ({mod})")
            elif target in NARROW.get(owner, {}) and not any(
                    mod == m or mod.startswith(m + ".") for m in NARROW[owner][target]):
                bad.append(f"{owner} imports of agentrl.{target} only {sorted(NARROW[owner][target])} ({mod})")
        bad += [f"{owner} imports {mod}" for b in FORBIDDEN_THIRD_PARTY.get(owner, ())
                if mod == b or mod.startswith(b + ".")]
        if owner in STDLIB_ONLY and parts[0] not in sys.stdlib_module_names and parts[0] != "__future__":
            bad.append(f"{owner} must use the standard library only ({mod})")
    return bad


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PKG)))
def test_dependency_directions(path: Path) -> None:
    if path == PKG / "__init__.py":
        return
    assert _violations(_owner(path), _imports(path)) == [], path.relative_to(PKG)


JOB_FILES = sorted(JOBS.glob("*.py"))


@pytest.mark.parametrize("path", JOB_FILES, ids=lambda p: p.name)
def test_jobs_never_import_jobs(path: Path) -> None:
    """An entry point imports the package, never another entry point."""
    assert [m for m in _imports(path) if m.split(".")[0] == "jobs"] == [], path.name


TESTS = ROOT / "tests"
TEST_FILES = sorted(TESTS.rglob("*.py"))


def _jobs_imports(path: Path) -> list[str]:
    return [m for m in _imports(path) if m.split(".")[0] == "jobs"]


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: str(p.relative_to(TESTS)))
def test_tests_never_import_jobs(path: Path) -> None:
    """A test imports the library; it runs an entry point only as a command (`python -m jobs.x` in a subprocess)."""
    assert _jobs_imports(path) == [], str(path.relative_to(TESTS))


def test_the_checker_catches_violations(tmp_path: Path) -> None:
    """The rule table is live: each forbidden direction of docs/architecture.md §2 is reported."""
    bad = tmp_path / "x.py"
    bad.write_text("from agentrl.trainer.step import rl_step\nimport torch.distributed\nimport jobs.train\n")
    mods = _imports(bad)
    assert len(_violations("rollout", mods)) == 2  # trainer, jobs
    assert len(_violations("algorithms", mods)) == 3  # trainer, torch.distributed, jobs
    assert _violations("rollout", ["agentrl.serving.controller.server"]) != []
    assert _violations("launch", ["torch"]) != [] and _violations("launch", ["agentrl.config"]) == []
    assert _violations("trainer", ["agentrl.algorithms.ppo", "torch"]) == []
    assert _violations("auth", ["aiohttp"]) != [] and _violations("auth", ["hmac", "os.path"]) == []
    assert _violations("launch", ["agentrl.auth"]) == [] and _violations("trainer", ["agentrl.auth"]) != []
    job = tmp_path / "job.py"
    job.write_text("from jobs.controller import serve\nimport agentrl.config\n")
    assert [m for m in _imports(job) if m.split(".")[0] == "jobs"] == ["jobs.controller"]


def _module_name(path: Path, root: Path) -> str:
    """`root/agentrl/tasks/db/task.py` -> "agentrl.tasks.db.task" (a package: its `__init__`)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that `path` imports anywhere in its body, functions included. `from p import m`
    names the module `p.m` when it is one, else `p`; the parents Python imports on the way are not edges
    (a package's own modules may import each other while its `__init__` runs)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            subs = {f"{node.module}.{a.name}" for a in node.names} & known
            found |= subs if len(subs) == len(node.names) else subs | {node.module}
    return found & known


def import_cycles(files: Iterable[Path], root: Path) -> list[list[str]]:
    """Every set of modules among `files` that import each other in a circle (Tarjan's strongly connected
    components with more than one module, or a module importing itself), each sorted."""
    paths = {_module_name(p, root): p for p in files}
    graph = {m: sorted(_imported_modules(p, set(paths))) for m, p in paths.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(m: str) -> None:
        index[m] = low[m] = len(index)
        stack.append(m)
        on_stack.add(m)
        for n in graph[m]:
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in on_stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            component = []
            while True:
                n = stack.pop()
                on_stack.discard(n)
                component.append(n)
                if n == m:
                    break
            if len(component) > 1 or m in graph[m]:
                cycles.append(sorted(component))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return sorted(cycles)


def test_modules_import_one_way() -> None:
    """No circle anywhere in the package (a task package reads task -> faithful -> episode -> data, never back):
    an import inside a method that closes a circle counts too."""
    assert import_cycles(PKG.rglob("*.py"), ROOT) == []


MAX_LINES = 600
"""The most lines a .py file of the package may have."""


def test_no_module_is_longer_than_max_lines() -> None:
    """The package's files stay small and named for what they hold: none is longer than 600 lines (a module that
    grows past it is split by what its parts hold, each part named for it, not cut at a line number)."""
    long = {str(p.relative_to(PKG)): n for p in FILES if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"over {MAX_LINES} lines: {long}"


ROLLOUT_READS_OF_TASKS = {"agentrl.tasks.api", "agentrl.tasks.json_args"}
"""What the rollout may import of `agentrl.tasks`: the API's error type, the bounded JSON reader of tool calls."""
BUILDS_TASKS = {"rollout/model_check.py"}
"""A tool in rollout/ that builds the tasks in its own process (`jobs.check_model`), never a rank's code."""


def test_the_rollout_never_imports_the_tasks() -> None:
    """A rollout rank learns task names from the config (`agentrl.config.task_options.task_names`) and reaches
    the tasks through the serving layer: neither the registry nor a task module is imported by its code."""
    for path in sorted((PKG / "rollout").rglob("*.py")):
        if str(path.relative_to(PKG)) in BUILDS_TASKS:
            continue
        tasks = {m for m in _imports(path) if m == "agentrl.tasks" or m.startswith("agentrl.tasks.")}
        assert tasks <= ROLLOUT_READS_OF_TASKS, f"{path.relative_to(PKG)} imports {tasks - ROLLOUT_READS_OF_TASKS}"


def test_the_tasks_import_only_the_api() -> None:
    """What docs/tasks.md teaches stands alone: `agentrl.tasks.api` needs nothing of ours but `agentrl.types`,
    the serving layer's JSON types nothing of the tasks but that API."""
    assert {m for m in _imports(PKG / "tasks" / "api.py") if m.startswith("agentrl.")} <= {"agentrl.types"}
    wire = {m for m in _imports(PKG / "serving" / "wire_types.py") if m.startswith("agentrl.")}
    assert wire <= {"agentrl.types", "agentrl.tasks.api"}, wire


def test_the_cycle_check_catches_a_circle(tmp_path: Path) -> None:
    """A circle through a method-level import, and one through a package's `__init__`, are both found;
    a package whose modules import siblings (while `__init__` re-exports them) is not a circle."""
    pkg = tmp_path / "agentrl" / "tasks"
    (pkg / "t").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "from agentrl.tasks.b import X\n",
        "b.py": "def f():\n    from agentrl.tasks import a\n",
        "t/__init__.py": "from agentrl.tasks.t.task import T\n",
        "t/task.py": "from agentrl.tasks.t.episode import E\n",
        "t/episode.py": "from agentrl.tasks.t.data import D\n",
        "t/data.py": "import json\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    assert import_cycles(pkg.rglob("*.py"), tmp_path) == [["agentrl.tasks.a", "agentrl.tasks.b"]]
    (pkg / "t" / "data.py").write_text("from agentrl.tasks.t import T\n")  # back through the package
    assert import_cycles(pkg.rglob("*.py"), tmp_path) == [
        ["agentrl.tasks.a", "agentrl.tasks.b"],
        ["agentrl.tasks.t", "agentrl.tasks.t.data", "agentrl.tasks.t.episode",
         "agentrl.tasks.t.task"]]
