"""Shared fixtures (a tokenizer built offline from the lookup task's own text) and the tests' grouping for
pytest-xdist (pyproject: `-n 2 --dist loadgroup`)."""
from __future__ import annotations

import pytest

# Tests that must not run beside each other share a group, and a group runs on one worker, in order:
#   e2e    tests/e2e/: whole runs of the loop (vLLM, MPI, every role), minutes each on 2 cores;
#   slurm  tests/launch/test_slurm_*.py: the one-host Slurm's nodes hold one of its jobs at a time;
#   envs   tests/envs/: the os sandboxes of a root worker all run as one host uid (RLIMIT_NPROC counts
#          them together), and the db tests start private MariaDB servers.
# Every other test is grouped with its file (its module fixtures are made once). The first two groups come
# first so that the two workers start on one each (`--no-loadscope-reorder` keeps this order); the rest
# go to whichever worker runs out of work. The groups come from the tests' paths, not `xdist_group` marks:
# xdist (3.8) files a marked test under its group by rewriting `item._nodeid`, which pytest 9.2 no longer
# reads, so marked tests were scheduled one by one.
FIRST = ("e2e", "slurm", "envs")


def xdist_group_of(nodeid: str) -> str:
    """The group of the test `nodeid` (see above): a group name, or its file's path."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    if len(parts) >= 3 and parts[0] == "tests":
        if parts[1] == "e2e":
            return "e2e"
        if parts[1] == "launch" and parts[2].startswith("test_slurm"):
            return "slurm"
        if parts[1] == "envs":
            return "envs"
    return path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {g: i for i, g in enumerate(FIRST)}
    items.sort(key=lambda it: rank.get(xdist_group_of(it.nodeid), len(FIRST)))  # stable: groups keep their order


def pytest_xdist_make_scheduler(config: pytest.Config, log):  # the scheduler xdist runs (its hook)
    """With `--dist loadgroup`: whole groups (`xdist_group_of`) to a worker."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class PathGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group_of(nodeid)

    return PathGroups(config, log)


@pytest.fixture(scope="session")
def lookup_tokenizer():
    """The tokenizer the demo builds (agentrl.models.tiny_policy), from 200 rendered expert episodes of `lookup`."""
    from agentrl.models.tiny_policy import build_tokenizer, expert_conversations

    return build_tokenizer(["lookup"], expert_conversations("lookup", 200, seed=0), 800)


@pytest.fixture(scope="session")
def lookup_format(lookup_tokenizer):
    """That tokenizer's conversation format as the rollout uses it: the tiny model's template, vLLM's hermes
    parser, <|im_end|> and <|endoftext|> as stop tokens, the template check strict."""
    from agentrl.models import tiny_chat
    from agentrl.rollout.chat import ChatFormat

    stops = tuple(lookup_tokenizer.convert_tokens_to_ids(t) for t in (tiny_chat.IM_END, tiny_chat.EOS))
    return ChatFormat.of(lookup_tokenizer, "hermes", stops, check_mode="strict")
