"""A fixture AgentBench checkout in AgentBench's real layout (THUDM/AgentBench, main), built from this
project's dev subsets (`data/agentbench/`) placed at the paths AgentBench keeps them under.

Each dev subset also stands in as its task's test split (AgentBench's own test files are not in this
repository), and the train files are left out on purpose: a split must load without the others. The
task servers' prompts are stand-ins written here, not AgentBench's text (this project does not copy
it): tests check that the faithful protocol reads whatever the checkout says. Tool configs: the copies
of `configs/tasks/{kg,alfworld,webshop}.yaml` in `data/agentbench/`; `dbbench.yaml` and kg's `TOOLS`
are written from our tool schemas (the same as AgentBench-FC's, the task tests check them).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from agentrl.tasks.db import TOOLS as DB_TOOLS
from agentrl.tasks.kg import TOOLS as KG_TOOLS

DEV = Path(__file__).resolve().parents[2] / "data" / "agentbench"

PROMPTS = {
    "db": "Fixture dbbench prompt: answer with SQL.",
    "kg": "Fixture kg instructions, at most {max_round} rounds.",
    "alfworld": "Fixture alfworld instruction.",
    "webshop": "\nFixture webshop prompt.\n",
}
KG_ONE_SHOT = [{"role": "user", "content": "Fixture one-shot question"},
               {"role": "assistant", "content": "Final Answer: #0"}]


def build_checkout(root: Path) -> Path:
    """Write the fixture checkout under `root` and return it."""
    placed = {
        "dbbench/dev.jsonl": ["data/dbbench/dev.jsonl", "data/dbbench/standard.jsonl"],
        "knowledgegraph/dev.json": ["data/knowledgegraph/dev.json", "data/knowledgegraph/std.json"],
        "alfworld/dev.json": ["data/alfworld/dev.json", "data/alfworld/new_std.json"],
        "os_interaction/dev.json": ["data/os_interaction/data/dev.json"],
        "configs-kg.yaml": ["configs/tasks/kg.yaml"],
        "configs-alfworld.yaml": ["configs/tasks/alfworld.yaml"],
        "configs-webshop.yaml": ["configs/tasks/webshop.yaml"],
    }
    for src, targets in placed.items():
        for target in targets:
            (root / target).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(DEV / src, root / target)
    shutil.copytree(DEV / "os_interaction/scripts/dev", root / "data/os_interaction/scripts/dev")
    db_config = {"default": {"parameters": {"max_round": 15, "tools": DB_TOOLS}},
                 "dbbench-std": {"parameters": {"data_file": "data/dbbench/standard.jsonl"}}}
    _write(root / "configs/tasks/dbbench.yaml", yaml.safe_dump(db_config, sort_keys=False))
    tasks = root / "src/server/tasks"
    _write(tasks / "dbbench/task.py", f"import os\n\nSYSTEM_PROMPT = {PROMPTS['db']!r}\n")
    _write(tasks / "knowledgegraph/const.py",
           f"INSTRUCTIONS = {PROMPTS['kg']!r}\nTOOLS = {KG_TOOLS!r}\nONE_SHOT = {KG_ONE_SHOT!r}\n")
    _write(tasks / "alfworld/task.py", "class ALFWorld:\n    @staticmethod\n    def get_task_instruction():\n"
                                       f"        return {PROMPTS['alfworld']!r}\n")
    _write(tasks / "webshop/task.py", f"prompt_with_max_turn = {PROMPTS['webshop']!r}\n")
    return root


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
