"""AgentBench's os_interaction sample format: one problem, its scripts, and how they run in a sandbox.

`parse_problem` / `load_problems` read AgentBench's files by the same rules as its loader
(`OSInteraction._load_configs`); `script_argv` turns a script into the program a sandbox runs, the
way AgentBench's `execute_independent` does, except that python runs as the image's own interpreter
in isolated mode without `site` (`agentrl.sandbox.python_argv`), so that nothing the agent put on PATH, in
/root or in site-packages runs inside a grader. Where the files of each split are in a checkout:
`agentrl.tasks.os_task.faithful`.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.sandbox import python_argv

Script = tuple[str, str]  # (language, code)


@dataclass
class OsProblem:
    """One sample in AgentBench's os_interaction format, with its scripts loaded."""

    description: str
    init: list[Script] = field(default_factory=list)
    start: Script | None = None
    match: dict[str, Any] | None = None
    check: list[Script | None] | None = None
    example: Script | None = None
    """The reference solution: `evaluation.example` (used by a `check`), else a top-level `example`."""
    labels: list[str] = field(default_factory=list)


def _script(obj: Any, script_dir: Path | None) -> Script | None:
    """AgentBench's script object: a bash string, or {language?, code | file}; None stays None."""
    if obj is None:
        return None
    if isinstance(obj, str):
        return ("bash", obj)
    if not isinstance(obj, dict):
        raise ValueError(f"a script must be a string or an object, got {type(obj).__name__}")
    language = str(obj.get("language", "bash"))
    if "file" in obj:
        if script_dir is None:
            raise ValueError(f"script file {obj['file']!r} given but no script directory")
        return (language, (script_dir / str(obj["file"])).read_text(encoding="utf-8"))
    if "code" in obj:
        return (language, str(obj["code"]))
    raise ValueError("a script object needs 'code' or 'file'")


def parse_problem(item: dict[str, Any], script_dir: Path | None) -> OsProblem:
    """One item of an AgentBench os_interaction file, read by the same rules as AgentBench's loader."""
    problem = OsProblem(description=str(item["description"]), labels=list(item.get("labels") or []))
    create = item.get("create")
    if isinstance(create, dict) and "init" in create:  # a non-object `create` (seen in dev.json) has no init
        init = create["init"]
        scripts = init if isinstance(init, list) else [init]
        problem.init = [s for s in (_script(x, script_dir) for x in scripts) if s is not None]
    if "start" in item:
        problem.start = _script(item["start"], script_dir)
    evaluation = item["evaluation"]
    if "match" in evaluation:
        match = evaluation["match"]
        problem.match = {"answer": match, "strip": True} if isinstance(match, str) else dict(match)
    elif "check" in evaluation:
        check = evaluation["check"]
        problem.check = [_script(x, script_dir) for x in (check if isinstance(check, list) else [check])]
    else:
        raise ValueError("the evaluation needs 'match' or 'check'")
    if "example" in evaluation:
        problem.example = _script(evaluation["example"], script_dir)
    elif "example" in item:
        problem.example = _script(item["example"], script_dir)
    return problem


def load_problems(path: Path, script_dir: Path | None) -> list[OsProblem]:
    """All samples of one AgentBench os file (.json: a list or one object; .jsonl: one per line)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        items = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        raw = json.loads(text)
        items = raw if isinstance(raw, list) else [raw]
    problems = []
    for n, item in enumerate(items):
        try:
            problems.append(parse_problem(item, script_dir))
        except (KeyError, TypeError, ValueError, OSError) as e:
            raise ValueError(f"{path} item {n}: not in AgentBench's os format ({type(e).__name__}: {e})") from e
    return problems


def script_argv(script: Script, params: list[str]) -> list[str]:
    """The program that runs a script in the sandbox, AgentBench's way (bash gets `--` before params)."""
    language, code = script
    if language == "bash":
        return ["bash", "-c", code, *(["--", *params] if params else [])]
    if language == "python":
        return python_argv(code, params)
    if language in ("c", "c++"):
        compiler = "gcc" if language == "c" else "g++"
        src = "/tmp/agentrl_main.src"
        build = f'printf %s "$1" > {src} && {compiler} -x {language} -o /tmp/a.out {src}'
        return ["bash", "-c", f'{build} && shift && exec /tmp/a.out "$@"', "--", code, *params]
    raise ValueError(f"unsupported script language {language!r}")


def shell_command(script: Script) -> str:
    """A script as one command for the interactive shell (the expert's bash_action, a start script)."""
    language, code = script
    if language == "bash":
        return code
    if language == "python":
        return shlex.join(["python3", "-c", code])
    return shlex.join(script_argv(script, []))
