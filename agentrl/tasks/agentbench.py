"""An AgentBench checkout as the AgentBench-FC tasks read it: its real layout, and the prompts and tool
descriptions of its task servers, read at run time.

This project does not copy AgentBench's prompts: in the faithful protocol (`agentrl.tasks.protocol`) a
task takes them from the user's own checkout (the public THUDM/AgentBench repository, function-calling
main branch). Python sources are parsed with `ast`, never imported or run: a constant is read with
`ast.literal_eval`, a prompt a function returns from its `return "..."` statement. Configs are its
`configs/tasks/<task>.yaml`, a task section's parameters laid over the file's `default` ones, as
AgentBench's config loader does.

Layout, as in the repository (paths relative to the checkout):
  * db: `data/dbbench/{db_out_new.jsonl (train), standard.jsonl (test), dev.jsonl}`, prompt in
    `src/server/tasks/dbbench/task.py` (`SYSTEM_PROMPT`), tools in `configs/tasks/dbbench.yaml`;
  * kg: `data/knowledgegraph/{kg_rl_all.json, std.json, dev.json}`, prompt, one-shot example and tools
    in `src/server/tasks/knowledgegraph/const.py`, `one_shot` per split in `configs/tasks/kg.yaml`;
  * alfworld: `data/alfworld/{train_valid.json, new_std.json, standard.json, dev.json}` (lists of game
    paths under ALFWorld's data), prompt in `src/server/tasks/alfworld/task.py`
    (`get_task_instruction`), tools and split names in `configs/tasks/alfworld.yaml`;
  * webshop: the goal ranges (`start`, `end`) and tools in `configs/tasks/webshop.yaml`, prompt in
    `src/server/tasks/webshop/task.py` (`prompt_with_max_turn`); the catalog is WebShop's own data;
  * os: `data/os_interaction/{data/, scripts/, train_0317/}` (read by the os task).

`AgentBenchPrompts` is what a task's faithful protocol shows the model (system prompt, tool schemas,
round limit), read through a `PromptSource` that says where that task server keeps them; db, kg,
alfworld and webshop share it (kg extends it with its one-shot example).
"""
from __future__ import annotations

import ast
import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.tasks.shared import env_path

ENV_VAR = "AGENTRL_AGENTBENCH_DIR"


class Checkout:
    """A checkout of AgentBench at `root` (the folder holding `data/`, `src/` and `configs/`)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser()
        if not (self.root / "data").is_dir():
            raise FileNotFoundError(f"{self.root} is not an AgentBench checkout (it has no data/ folder)")

    @classmethod
    def find(cls, agentbench_dir: str | Path | None) -> Checkout | None:
        """The checkout given, else the one in `AGENTRL_AGENTBENCH_DIR`, else None."""
        root = Path(agentbench_dir) if agentbench_dir else env_path(ENV_VAR)
        return cls(root) if root is not None else None

    def path(self, relative: str) -> Path:
        return self.root / relative

    def _module(self, relative: str) -> ast.Module:
        path = self.path(relative)
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: the faithful protocol reads AgentBench-FC's prompts from "
                                    "a checkout of its public repository (function-calling main branch)")
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))

    def constant(self, relative: str, name: str) -> Any:
        """The literal value assigned to the module-level `name` in the Python file `relative`."""
        for node in self._module(relative).body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return ast.literal_eval(node.value)
        raise KeyError(f"{self.path(relative)} assigns no {name}")

    def returned_string(self, relative: str, function: str) -> str:
        """The string literal that function (or method) `function` of the Python file returns."""
        for node in ast.walk(self._module(relative)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Return) and inner.value is not None:
                        value = ast.literal_eval(inner.value)
                        if isinstance(value, str):
                            return value
        raise KeyError(f"{self.path(relative)} has no function {function} returning a string")

    def task_config(self, relative: str, section: str) -> dict[str, Any]:
        """The parameters of `section` in a `configs/tasks/*.yaml` file, over its `default` ones."""
        import yaml

        path = self.path(relative)
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found (AgentBench's task configs)")
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        params = copy.deepcopy((config.get("default") or {}).get("parameters") or {})
        if section not in config:
            raise KeyError(f"{path} has no section {section!r}")
        params.update((config[section] or {}).get("parameters") or {})
        return params


@dataclass(frozen=True)
class PromptSource:
    """Where one AgentBench-FC task server keeps what its faithful protocol shows the model.

    The tools and the round limit are parameters of a section of the task's config (the test split's,
    which is what AgentBench evaluates); the system prompt is a constant of a Python file, or the string a
    function of it returns. kg keeps its tools in that Python file instead (`tools_constant`).
    """

    config: str
    """`configs/tasks/<task>.yaml`."""
    section: str
    """The config section whose parameters hold the tools and the round limit."""
    rounds_key: str
    """The parameter that holds the round limit (each task server names it its own way)."""
    default_rounds: int
    """The round limit when the section does not set it (the task server's own default)."""
    prompt_file: str
    """The Python file that holds the system prompt."""
    prompt: str
    """The module-level constant holding the prompt, or the function returning it (`returned`)."""
    returned: bool = False
    tools_constant: str = ""
    """When set, the tools are this constant of `prompt_file`, not a config parameter."""


@dataclass(frozen=True)
class AgentBenchPrompts:
    """What a faithful episode shows the model, as the user's checkout says: never our own words."""

    system: str
    tools: list[dict[str, Any]]
    max_rounds: int

    @classmethod
    def read(cls, checkout: Checkout, source: PromptSource) -> AgentBenchPrompts:
        """The prompts of the task server that `source` describes, from `checkout`."""
        config = checkout.task_config(source.config, source.section)
        if source.returned:
            system = checkout.returned_string(source.prompt_file, source.prompt)
        else:
            system = str(checkout.constant(source.prompt_file, source.prompt))
        tools = (checkout.constant(source.prompt_file, source.tools_constant) if source.tools_constant
                 else config["tools"])
        rounds = int(config.get(source.rounds_key, source.default_rounds))
        return cls(system=system, tools=list(tools), max_rounds=rounds)
