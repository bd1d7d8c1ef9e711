"""`agentrl.checks.replay`'s os replay (the os task's expert, through its public Task API) and its
failure classes: on this project's os samples, and on samples made to fail each way, in a stand-in
checkout in AgentBench's layout."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from os_fixtures import agentbench_checkout
from sandbox_helpers import require_sandbox

from agentrl.checks.replay import NETWORK_COMMANDS, check, replay_os
from agentrl.tasks import get_task
from agentrl.tasks.os_task import OsTask


def test_network_commands_are_recognised() -> None:
    assert NETWORK_COMMANDS.search("apt-get install -y jq") and NETWORK_COMMANDS.search("pip install x")
    assert not NETWORK_COMMANDS.search("grep -c apple fruits.txt")


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the os task's sandbox needs bubblewrap")
def test_os_examples_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTRL_AGENTBENCH_DIR", raising=False)  # this project's samples
    result = check(get_task("os"), "test", replay_os, limit=2, workers=1)
    assert (result["passed"], result["total"], result["failures"]) == (2, 2, {}), result["details"]


INT_CHECK = {"language": "python", "code": "from sys import argv\nif int(argv[1]) == int(argv[2]): exit(0)\nexit(1)"}
CLASSED = [  # (sample in AgentBench's format, the class the check must give it)
    ({"description": "count the processes", "evaluation": {"check": [None, INT_CHECK], "example": "ps -e | wc -l"}},
     "data defect"),  # as AgentBench's test-56/test-131: the grader's own `bash -c` is counted
    ({"description": "fix a library", "create": {"init": "chmod u+s /usr/lib/os-release"},
      "evaluation": {"check": [{"language": "bash", "code": "exit 0"}], "example": "true"}}, "our defect"),
    ({"description": "sudo", "create": {"init": "echo \"W: Failed to fetch http://deb.debian.org/x  Temporary "
                                                "failure resolving 'deb.debian.org'\"; exit 100"},
      "evaluation": {"match": "1"}}, "needs the network"),
    ({"description": "page size", "evaluation": {"check": [{"language": "bash", "code": "[ \"$1\" -gt 100 ]"}],
                                                 "example": "curl -s http://example.com | wc -c"}}, "needs the network"),
    ({"description": "never passes", "evaluation": {"check": [{"language": "bash", "code": "exit 1"}],
                                                    "example": "ps -e | wc -l"}}, "our defect"),
]


def check_stand_ins(tmp_path: Path, group: int, samples: list[tuple[dict[str, Any], str]],
                    scripts: dict[str, str] | None = None) -> tuple[OsTask, int, dict[str, str]]:
    """`samples` as test group `group` of a stand-in checkout (with `scripts` under its scripts dir), checked:
    each must fail with its class, the checkout's own 4 samples must pass. Returns (task, index of the first
    sample, the evidence by id)."""
    require_sandbox()
    checkout = agentbench_checkout(tmp_path)
    (checkout / f"data/os_interaction/data/{group}").mkdir()
    (checkout / f"data/os_interaction/data/{group}/s.json").write_text(json.dumps([item for item, _ in samples]))
    for name, text in (scripts or {}).items():
        path = checkout / f"data/os_interaction/scripts/{group}" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    task = OsTask(source="agentbench", agentbench_dir=checkout, sandbox={"backend": "bwrap", "command_timeout_s": 5.0})
    first = len(task.indices("test")) - len(samples)  # the stand-in checkout's own samples come first
    result = check(task, "test", replay_os, limit=None, workers=2)
    expected: dict[str, list[str]] = {}
    for n, (_, kind) in enumerate(samples):
        expected.setdefault(kind, []).append(f"test-{first + n}")
    assert {k: sorted(v) for k, v in result["failures"].items()} == {k: sorted(v) for k, v in expected.items()}, \
        result["details"]
    assert result["passed"] == first == 4
    return task, first, result["details"]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the os task's sandbox needs bubblewrap")
def test_os_failures_are_classified_from_the_episode(tmp_path: Path) -> None:
    _, first, details = check_stand_ins(tmp_path, 3, CLASSED)
    assert "n fails, n + 1 passes" in details[f"test-{first}"]
    assert "Read-only file system" in details[f"test-{first + 1}"]
    assert "Temporary failure resolving" in details[f"test-{first + 2}"]
    assert "curl" in details[f"test-{first + 3}"]
    assert details[f"test-{first + 4}"].endswith("status completed, reward 0.0")


SIZE_CHECK = '''from sys import argv
def size(text):
    text = text.strip()
    for unit, factor in {"K": 1024, "M": 1024 * 1024}.items():
        if text.endswith(unit):
            return int(text[:-len(unit)]) * factor
    return int(text)
exit(0 if size(argv[1]) == size(argv[2]) else 1)
'''  # as AgentBench's size-match.py: int() of "4.0" raises
REPLAYED = [  # failures shown by replaying the sample's own scripts: (sample, the class the check must give it)
    ({"description": "size", "evaluation": {"check": [None, {"language": "python", "file": "check/size.py"}],
                                            "example": "echo 4.0K"}}, "data defect"),
    ({"description": "random", "evaluation": {"check": [None, INT_CHECK],
                                              "example": "echo $((RANDOM * 32768 + RANDOM))"}}, "data defect"),
    ({"description": "fd", "create": {"init": "echo 1 999999999>/tmp/x"}, "evaluation": {"match": "1"}}, "host limit"),
    ({"description": "low fd", "create": {"init": "echo 1 >&9"}, "evaluation": {"match": "1"}}, "our defect"),
    # the example changes what it counts: the grader's rerun prints 2, but every fresh session's first run 1
    ({"description": "stateful", "evaluation": {"check": [None, INT_CHECK],
                                                "example": "echo x >> /root/f; wc -l < /root/f"}}, "data defect"),
    # the grader sees another system than the shell (here: its own mounts), as test-42's `du -sh /usr` did on 639fcf2
    ({"description": "mounts", "evaluation": {"check": [None, INT_CHECK],
                                              "example": "grep -c . /proc/self/mountinfo"}}, "our defect"),
    # the same, where the sample's setup varies between sessions (as test-19's on 639fcf2)
    ({"description": "mounts again", "create": {"init": "echo $RANDOM$RANDOM > /root/r"},
      "evaluation": {"check": [None, INT_CHECK],
                     "example": "echo $(cat /root/r)$(grep -c . /proc/self/mountinfo)"}}, "our defect"),
]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the os task's sandbox needs bubblewrap")
def test_os_failures_shown_by_replaying_the_samples_scripts(tmp_path: Path) -> None:
    task, first, details = check_stand_ins(tmp_path, 4, REPLAYED, {"check/size.py": SIZE_CHECK})
    size = details[f"test-{first}"]
    assert "answer '4.0K'" in size and "check script 2 of 2" in size, size
    assert size.endswith("\"ValueError: invalid literal for int() with base 10: '4.0'\""), size
    random = details[f"test-{first + 1}"]  # 13 runs of a 30-bit random number: all different
    assert "13 runs" in random and re.search(r"\{('\d+': 1, ){5}'\d+': 1\}", random), random
    fd = details[f"test-{first + 2}"]
    assert f"descriptor 999999999 ('999999999: Bad file descriptor'), at or above the sandbox's open-file limit " \
           f"{task.sandbox.nofile()} " in fd, fd
    assert "RLIMIT_NOFILE above 999999999" in fd, fd
    low = details[f"test-{first + 3}"]  # fd 9 is within the limit: a setup failure of ours
    assert low.startswith("our defect: setup fails here") and "9: Bad file descriptor" in low, low
    stateful = details[f"test-{first + 4}"]  # not "varies": every fresh session prints 1 first
    assert "changes the state it reports on: in the agent's shell it prints '1', and the grader's rerun on the " \
           "state that run left prints '2'" in stateful, stateful
    view = details[f"test-{first + 5}"]
    assert view.startswith("our defect: the grader's view differs from the agent's shell: the example prints '"), view
    racy = details[f"test-{first + 6}"]
    assert racy.startswith("our defect: the example's output varies between fresh sessions") and \
        "the grader's view differs from the agent's shell" in racy, racy
