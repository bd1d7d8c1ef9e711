"""A stand-in AgentBench checkout in AgentBench's own layout, for the `os` task's tests.

Paths are AgentBench's (`data/os_interaction/data/<n>/*.json`, `.../scripts/<n>/`, `train_0317/`,
`data/dev.json`, `configs/tasks/os.yaml`, `src/server/tasks/os_interaction/task.py`); the contents
are this project's: the dev subset committed in `data/agentbench/`, a few samples, the tool schemas
of `os_task.TOOLS`, and a task.py shaped like AgentBench's (a `system_message` string and a user
f-string in `_inject_initial_messages`) with placeholder wording, since the faithful protocol reads
the prompts from there.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from agentrl.tasks.os_task import TOOLS

REPO = Path(__file__).resolve().parents[2]
SYSTEM = "SYSTEM PROMPT OF THE CHECKOUT: call exactly one tool per turn."
TASK_PY = '''
class OSInteraction:
    def _inject_initial_messages(self, session, description: str) -> None:
        system_message = """SYSTEM PROMPT OF THE CHECKOUT: call exactly one tool per turn."""
        session.inject({"role": "system", "content": system_message})
        session.inject({"role": "user", "content": f'PROBLEM FROM THE CHECKOUT:\\n\\n{description}'})
'''


def agentbench_checkout(root: Path) -> Path:
    """Write the stand-in checkout under `root`; return its path."""
    os_dir = root / "data" / "os_interaction"
    (os_dir / "data" / "1").mkdir(parents=True)
    (os_dir / "data" / "1" / "a.json").write_text(json.dumps(
        [{"description": f"x{n}", "evaluation": {"match": "1"}} for n in range(3)]))
    (os_dir / "data" / "2").mkdir()
    (os_dir / "data" / "2" / "b.json").write_text(json.dumps(
        {"description": "y", "evaluation": {"check": [None, {"language": "python", "file": "check/m.py"}],
                                            "example": "echo 1"}}))
    (os_dir / "scripts" / "2" / "check").mkdir(parents=True)
    (os_dir / "scripts" / "2" / "check" / "m.py").write_text("print(1)")
    (os_dir / "train_0317").mkdir()
    (os_dir / "train_0317" / "training.json").write_text(json.dumps({"description": "z", "evaluation": {"match": "2"}}))
    dev = REPO / "data" / "agentbench" / "os_interaction"
    shutil.copy(dev / "dev.json", os_dir / "data" / "dev.json")
    shutil.copytree(dev / "scripts" / "dev", os_dir / "scripts" / "dev")
    (root / "configs" / "tasks").mkdir(parents=True)
    (root / "configs" / "tasks" / "os.yaml").write_text(yaml.safe_dump(
        {"default": {"parameters": {"round_limit": 8, "tools": TOOLS}}}))
    src = root / "src" / "server" / "tasks" / "os_interaction"
    src.mkdir(parents=True)
    (src / "task.py").write_text(TASK_PY)
    return root
