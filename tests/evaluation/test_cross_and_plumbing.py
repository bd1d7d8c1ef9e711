"""Cross-sampling's pass@k curves against brute force, and the evaluation's plumbing that needs no model:
targets, the scope, resumed scoring with env errors kept, the progress lines, the endpoint loop's endings."""
from __future__ import annotations

import asyncio
import io
import itertools
import json
from pathlib import Path

import pytest

from agentrl.evaluation import cross
from agentrl.evaluation.endpoint import ContextTooLong, Reply, play_endpoint_episode
from agentrl.evaluation.played import Played
from agentrl.evaluation.players import EndpointPlayer
from agentrl.evaluation.progress import Progress
from agentrl.evaluation.runner import EvalScope, scope_keys, score
from agentrl.evaluation.targets import resolve
from agentrl.monitor.eval_results import ResultsFile, ScoredEpisode, aggregate
from agentrl.rollout.agent_loop import EpisodeLimits
from agentrl.rollout.collect import Retry
from agentrl.serving.inprocess import InProcessClient
from agentrl.tasks import get_task
from agentrl.types import Status

LIMITS = EpisodeLimits(max_turns=0, max_model_len=1024, max_new_tokens=48)


def _brute_mix(a: list[int], b: list[int], k: int) -> float:
    """Every way to draw ceil(k/2) of A's outcomes and floor(k/2) of B's, the share holding a success."""
    draws = [any(x) or any(y) for x in itertools.combinations(a, (k + 1) // 2)
             for y in itertools.combinations(b, k // 2)]
    return sum(draws) / len(draws)


@pytest.mark.parametrize("a,b", [([1, 0, 0, 0], [0, 0, 1, 1]), ([0, 0, 0], [0, 0, 0]), ([1, 1, 0, 0, 0], [0, 1, 0])])
def test_mix_pass_at_k_equals_brute_force(a: list[int], b: list[int]) -> None:
    for k in range(1, min(2 * len(b) + 1, 2 * len(a)) + 1):
        if (k + 1) // 2 > len(a) or k // 2 > len(b):
            continue
        assert cross.mix_pass_at_k(len(a), sum(a), len(b), sum(b), k) == pytest.approx(_brute_mix(a, b, k))
    # by hand: one of 4 from A, two of 4 from B, k = 2: 1 - (3/4)(2/4) = 0.625
    assert cross.mix_pass_at_k(4, 1, 4, 2, 2) == pytest.approx(0.625)


def _eps(arm: str, outcomes: dict[str, list[int]]) -> list[ScoredEpisode]:
    return [ScoredEpisode("lookup", "test", i, s, float(o), float(o), "completed", extra={"arm": arm})
            for i, v in outcomes.items() for s, o in enumerate(v)]


def test_curves_per_arm_over_common_indices() -> None:
    arms = {"A": _eps("A", {"x": [1, 0, 0, 0], "y": [0, 0, 0, 0]}),
            "B": _eps("B", {"x": [0, 0, 0, 0], "y": [1, 1, 0, 0], "z": [1, 1, 1, 1]}),  # z: only B has it
            "cross": _eps("cross", {"x": [1, 1, 0, 0], "y": [0, 1, 0, 0]})}
    c = cross.curves(arms, max_k=8)["lookup"]
    assert len(c["cross"]) == 4  # K = the fewest samples of any arm's index
    assert c["single A"][0] == pytest.approx((0.25 + 0.0) / 2)
    assert c["single B"][0] == pytest.approx((0.0 + 0.5) / 2)  # z left out
    assert c["mix"][1] == pytest.approx((_brute_mix([1, 0, 0, 0], [0] * 4, 2) + _brute_mix([0] * 4, [1, 1, 0, 0], 2)) / 2)
    assert c["cross"][3] == pytest.approx(1.0)
    md = cross.curves_markdown({"lookup": c}, "v30", "v10", 0.5)
    assert "| cross | 37.5 |" in md and "p = 0.5" in md


def test_routed_endpoint_draws_per_turn() -> None:
    class Fixed:
        def __init__(self, name: str) -> None:
            self.name = name

        async def reply(self, *a: object) -> Reply:
            return Reply({"role": "assistant", "content": self.name}, "stop", 1, 1)

    r = cross.RoutedEndpoint(Fixed("a"), Fixed("b"), 0.3, seed=1)
    got = [asyncio.run(r.reply([], [], 8, 1.0, 1.0)).message["content"] for _ in range(400)]
    assert r.turns == [got.count("a"), got.count("b")] and 0.22 < got.count("b") / 400 < 0.38
    with pytest.raises(ValueError):
        cross.RoutedEndpoint(Fixed("a"), Fixed("b"), 1.5)


def test_targets(tmp_path: Path) -> None:
    run = tmp_path / "myrun"
    for v in (1, 3):
        (run / "weights" / f"v{v}").mkdir(parents=True)
        (run / "weights" / f"v{v}" / "config.json").write_text("{}")
    (run / "weights" / "v4").mkdir()  # being written: no config.json yet
    assert resolve(str(run)).model_dir == run / "weights" / "v3"
    assert resolve(f"{run}@v1").version == 1 and resolve(str(run), version=1).label == "myrun v1"
    with pytest.raises(FileNotFoundError, match=r"v2 are not on disk \(have \[1, 3\]\)"):
        resolve(str(run), version=2)
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert resolve(str(model)).model_dir == model and not resolve(str(model)).is_endpoint
    ep = resolve("http://127.0.0.1:9/v1#policy")
    assert ep.is_endpoint and ep.base_url == "http://127.0.0.1:9/v1" and ep.model == "policy"
    with pytest.raises(ValueError, match="model name"):
        resolve("http://127.0.0.1:9/v1")


class ExpertEndpoint:
    """The task's scripted expert behind the endpoint interface; every `fail_every`-th start an env error."""

    def __init__(self, client: InProcessClient) -> None:
        self.client = client

    async def reply(self, messages, tools, max_tokens, temperature, top_p) -> Reply:
        sid = next(iter(self.client.sessions))  # concurrency 1: the one live session
        return Reply(await self.client.expert(sid), "tool_calls", 10, 5)


class Flaky(InProcessClient):
    """Fails the first start of every index that ends in 1 with an env error, and index test-3 always."""

    def __init__(self) -> None:
        super().__init__({"lookup": get_task("lookup")})
        self.starts: dict[str, int] = {}

    async def start_sample(self, task, index):
        from agentrl.tasks.api import EnvError

        self.starts[index] = self.starts.get(index, 0) + 1
        if index == "test-3" or (index.endswith("1") and self.starts[index] == 1):
            raise EnvError("env_error", "worker went away")
        return await super().start_sample(task, index)


def test_resumed_scoring_keeps_env_errors_in_the_denominator(tmp_path: Path) -> None:
    client = Flaky()
    player = EndpointPlayer(client, ExpertEndpoint(client), 0.0, 1.0, LIMITS, Retry(max_retries=1, backoff_s=0.001))
    scope = EvalScope(("lookup",), "test", samples=4, runs=2, concurrency=1)
    keys = asyncio.run(scope_keys(client, scope))
    assert keys[:4] == [("lookup", "test", f"test-{i}", 0) for i in range(4)] and len(keys) == 8
    path = tmp_path / "r.jsonl"
    with ResultsFile(path) as rf:
        assert asyncio.run(score(player, keys[:3], rf, 1)) == 3
    with ResultsFile(path) as rf:
        out = io.StringIO()
        prog = Progress({"lookup": 8}, {"lookup": 3}, stream=out, bars=False, every_s=0.0)
        assert asyncio.run(score(player, keys, rf, 1, prog, arm="A")) == 5  # only the missing ones
        eps = rf.episodes
    assert client.starts["test-1"] == 3  # failed once (first run), retried, then fine
    assert client.starts["test-3"] == 4  # two runs, each first try + one retry
    r = aggregate(eps, ks=(1, 2))[("lookup", "test")]
    assert r.episodes == 8 and r.status["env_error"] == pytest.approx(2 / 8)
    assert r.success.mean == pytest.approx(3 / 4)  # the expert solves 3 of 4; test-3's errors count as failures
    assert r.pass_at_k[2] == pytest.approx(3 / 4)
    assert all(json.loads(x)["extra"].get("arm", "A") == "A" for x in path.read_text().splitlines()[3:])
    lines = out.getvalue().splitlines()
    assert len(lines) == 5 and lines[-1].startswith("eval lookup: 8/8 (100%) success 0.600 env_err 2")


class Scripted:
    def __init__(self, replies: list[Reply | Exception]) -> None:
        self.replies = replies

    async def reply(self, *a: object) -> Reply:
        r = self.replies.pop(0)
        if isinstance(r, Exception):
            raise r
        return r


def test_endpoint_loop_endings() -> None:
    def play(replies: list, limits: EpisodeLimits = LIMITS) -> Played:
        client = InProcessClient({"lookup": get_task("lookup")})
        return asyncio.run(play_endpoint_episode(client, Scripted(replies), "lookup", "test-0", 0.0, 1.0, limits))

    talk = Reply({"role": "assistant", "content": "hm"}, "stop", 100, 3)
    p = play([talk] * 4)  # lookup's own limit: 4 turns, never a call
    assert (p.status, p.turns, p.tokens, p.success) == (Status.TURN_LIMIT, 4, 12, 0.0)
    p = play([talk] * 2, EpisodeLimits(2, 1024, 48))  # the run's cap below the task's limit
    assert (p.status, p.turns) == (Status.TRUNCATED, 2)
    p = play([talk, ContextTooLong("too long")])
    assert (p.status, p.turns) == (Status.CONTEXT_LIMIT, 1)
    p = play([Reply({"role": "assistant", "content": "<tool_call>{"}, "length", 1000, 48)])
    assert p.status == Status.CONTEXT_LIMIT and p.context_tokens == 1048
    p = play([Reply({"role": "assistant", "content": "<tool_call>{"}, "length", 100, 48)] + [talk] * 3)
    assert p.status == Status.TURN_LIMIT  # cut off with room left: told so, the episode goes on


def test_sbatch_script_of_an_evaluation() -> None:
    from agentrl.evaluation.eval_job import EvalJob, eval_argv, render

    argv = ["runs/demo", "--tasks", "os,db", "--render-sbatch", "--slurm-partition", "gpu", "--slurm-time=2:00:00",
            "--label", "my model"]
    args = eval_argv(argv)
    assert args == ["runs/demo", "--tasks", "os,db", "--label", "my model"]
    script = render(EvalJob(partition="gpu", time="2:00:00", gpus=0), args)
    assert script.startswith("#!/bin/bash\n#SBATCH --job-name=agentrl-eval\n#SBATCH --nodes=1\n")
    assert "#SBATCH --partition=gpu\n" in script and "#SBATCH --time=2:00:00\n" in script
    assert "gpus" not in script and "#SBATCH --requeue\n" in script  # an endpoint's evaluation needs no GPU
    assert script.endswith("python -m jobs.eval runs/demo --tasks os,db --label 'my model' --progress lines\n")


def test_curves_figure_draws_every_arm(tmp_path: Path) -> None:
    from agentrl.evaluation.cross_plot import plot_curves

    c = {"lookup": {"single A": [0.2, 0.3], "single B": [0.1, 0.2], "mix": [0.2, 0.35], "cross": [0.25, 0.5]}}
    path = plot_curves(c, tmp_path / "c.png", "A vs B")
    assert path.stat().st_size > 1000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
