"""`jobs.eval`'s two ways of playing a model, against each other, and its results file under interruption.

One module fixture: the Qwen2.5-style stand-in taught the expert's episodes of three `lookup` test samples
(`taught_model`), served by vLLM's real OpenAI server (hermes tool parser). The same model is evaluated
through the local path (in-process `VLLMEngine`, the model's `ChatFormat`, the rollout's `run_episode`)
and through the endpoint path (tools in the request, parsed calls back, the message-level loop); greedy,
on the same samples, every sample must end the same way on both, and some must succeed.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from taught_model import build_taught

from agentrl.evaluation.evaluate import Settings, evaluate
from agentrl.evaluation.runner import EvalScope
from agentrl.evaluation.targets import resolve
from agentrl.monitor.eval_results import aggregate, read_results
from agentrl.monitor.eval_stats import t_quantile
from agentrl.monitor.eval_transcripts import read_transcripts
from agentrl.rollout.agent_loop import EpisodeLimits
from agentrl.rollout.collect import Retry
from agentrl.serving.inprocess import InProcessClient
from agentrl.tasks import get_task

# Teaching the model and starting two vLLM engines take a few minutes of CPU; on a machine shared with other
# jobs that stretches far past the suite's per-test limit (which counts the module fixture's set-up).
pytestmark = pytest.mark.timeout(1500)

TAUGHT = ["test-0", "test-1", "test-2"]
ROOT = Path(__file__).resolve().parents[2]
LIMITS = EpisodeLimits(max_turns=0, max_model_len=1024, max_new_tokens=48)
GREEDY = Settings(temperature=0.0, top_p=1.0, limits=LIMITS, retry=Retry(max_retries=1))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """vLLM's OpenAI server on the taught model, started in the background: `url()` waits for it, so that the
    local path's engine starts while the server does."""

    def __init__(self, model: Path, log_path: Path) -> None:
        self.model, self.log_path = model, log_path
        port = _free_port()
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
               "HF_HUB_OFFLINE": "1"}
        with log_path.open("w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host",
                 "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "1024",
                 "--enforce-eager", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                 "--served-model-name", "policy"],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self.up = False

    def url(self) -> str:
        import openai

        client = openai.OpenAI(base_url=self.base_url, api_key="none", timeout=30)
        deadline = time.monotonic() + 300
        while not self.up:
            try:
                client.models.list()
                self.up = True
            except openai.APIConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("the server did not start:\n" + self.log_path.read_text()[-3000:]) from None
                time.sleep(1)
        return self.base_url

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The taught stand-in and its server."""
    root = tmp_path_factory.mktemp("eval")
    model, margin = build_taught(root, TAUGHT)
    assert margin >= 2.0, f"the stand-in did not learn its demos: a taught token wins by only {margin:.3f} logits"
    server = Server(model, root / "server.log")
    try:
        yield server
    finally:
        server.stop()


def _lookup_client() -> InProcessClient:
    return InProcessClient({"lookup": get_task("lookup")})


def test_endpoint_and_local_paths_score_each_sample_alike_under_greedy(served, tmp_path: Path) -> None:
    # one episode at a time on both sides: the same batch shapes, so the same float32 logits and greedy tokens
    scope = EvalScope(("lookup",), "test", samples=5, runs=1, concurrency=1)
    local_table = asyncio.run(evaluate(_lookup_client(), resolve(str(served.model), label="local"), scope, GREEDY,
                                       tmp_path / "local", "eval", progress=False))
    remote_table = asyncio.run(evaluate(_lookup_client(), resolve(f"{served.url()}#policy"), scope, GREEDY,
                                        tmp_path / "endpoint", "eval", progress=False))
    local = {e.index: e for e in read_results(tmp_path / "local" / "eval.jsonl")}
    remote = {e.index: e for e in read_results(tmp_path / "endpoint" / "eval.jsonl")}
    assert sorted(local) == sorted(remote) == [f"test-{i}" for i in range(5)]
    for i in local:
        assert (local[i].success, local[i].status, local[i].turns) == \
            (remote[i].success, remote[i].status, remote[i].turns), i
    solved = [i for i, e in local.items() if e.success == 1.0]
    assert solved and set(solved) <= set(TAUGHT)  # it solves some of what it was taught, nothing else
    assert local["test-1"].tokens == remote["test-1"].tokens  # the same greedy tokens, counted by both
    assert "lookup" in local_table and "lookup" in remote_table
    # the transcripts: a turn per assistant message on both paths; where both solved a sample, the same calls
    # and the same env observations (an unreadable call's answer is each path's own: not compared)
    said = {side: {e["index"]: e for e in read_transcripts(tmp_path / side / "eval.transcripts.jsonl.gz")}
            for side in ("local", "endpoint")}
    assert sorted(said["local"]) == sorted(said["endpoint"]) == sorted(local)
    for side, scored in (("local", local), ("endpoint", remote)):
        for i, e in said[side].items():
            assert sum(m["role"] == "assistant" for m in e["messages"]) == scored[i].turns == e["turns"], (side, i)
    for i in solved:
        assert _exchange(said["local"][i]) == _exchange(said["endpoint"][i]), i
        assert _exchange(said["local"][i])[0][-1][0] == "submit_answer", i


def _exchange(e: dict) -> tuple[list, list]:
    """An episode's (tool calls as (name, arguments), the env's observations' texts)."""
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
             for m in e["messages"] if m["role"] == "assistant" for c in m.get("tool_calls", [])]
    return calls, [m["content"] for m in e["messages"] if m["role"] != "assistant" and "by" not in m]


def _eval_cli(url: str, out: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "jobs.eval", "--base-url", url, "--model", "policy", "--tasks", "lookup",
           "--max-model-len", "1024", "--max-new-tokens", "48", "--max-turns", "0", "--out", str(out), *extra]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)


def test_an_interrupted_evaluation_resumes_with_only_the_missing_episodes(served, tmp_path: Path) -> None:
    """Sampled (temperature 1), 2 runs of 6 samples, through launched controller and env worker processes:
    SIGINT after a few episodes leaves whole lines; a cut-off last line is skipped; the same command then
    scores exactly the missing episodes, and the tables' pass@k and interval are those of the file's episodes."""
    url = served.url()
    out = tmp_path / "ev"
    args = ("--samples", "6", "--runs", "2", "--temperature", "1.0", "--concurrency", "1")
    first = _eval_cli(url, out, *args)
    results = out / "eval-test.jsonl"
    deadline = time.monotonic() + 120
    while not (results.exists() and len(results.read_text().splitlines()) >= 3):
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()[0]
        time.sleep(0.2)
    first.send_signal(signal.SIGINT)
    text = first.communicate(timeout=60)[0]
    assert first.returncode != 0 and "run the same command to go on" in text, text
    lines = results.read_text().splitlines()
    assert 3 <= len(lines) < 12 and all(json.loads(x)["task"] == "lookup" for x in lines)
    kept = lines[:3]
    results.write_text("\n".join(kept) + "\n" + kept[0][:25])  # a kill in the middle of a write
    second = _eval_cli(url, out, *args)
    text = second.communicate(timeout=180)[0]
    assert second.returncode == 0, text
    assert "3 of 12 episodes already scored; scoring the other 9" in text, text
    after = results.read_text().splitlines()
    assert after[:3] == kept
    eps = read_results(results)
    assert len(eps) == 12 and {(e.index, e.sample) for e in eps} == {(f"test-{i}", s) for i in range(6) for s in (0, 1)}
    # one transcript per scored episode: those played before the kill and dropped from the file were played
    # again, and the reader keeps each key's last, the one its results line scored
    transcripts = {(t["index"], t["sample"]): t for t in read_transcripts(out / "eval-test.transcripts.jsonl.gz")}
    assert {k: t["status"] for k, t in transcripts.items()} == {(e.index, e.sample): e.status for e in eps}
    # the tables hold what the file's episodes say: pass@k by the unbiased estimator, the t-interval over runs
    table = json.loads((out / "eval-test.json").read_text())["tasks"][0]
    by_index: dict[str, list[int]] = {}
    by_run: dict[int, list[int]] = {}
    for e in eps:
        by_index.setdefault(e.index, []).append(int(e.success > 0.5))
        by_run.setdefault(e.sample, []).append(int(e.success > 0.5))
    pass2 = sum(1.0 if sum(v) >= 1 else 0.0 for v in by_index.values()) / 6  # n = k = 2: any success
    pass1 = sum(sum(v) / 2 for v in by_index.values()) / 6
    assert table["pass_at_k"]["1"] == pytest.approx(pass1) and table["pass_at_k"]["2"] == pytest.approx(pass2)
    runs = [sum(v) / 6 for _, v in sorted(by_run.items())]
    mean = sum(runs) / 2
    half = t_quantile(0.975, 1) * abs(runs[0] - runs[1]) / math.sqrt(2) / math.sqrt(2)
    assert table["success"]["mean"] == pytest.approx(mean)
    if runs[0] != runs[1]:
        assert table["success"]["hi"] - mean == pytest.approx(half)
    assert table["runs"] == 2 and table["episodes"] == 12
    assert aggregate(eps, ks=(1, 2))[("lookup", "test")].pass_at_k[2] == pytest.approx(pass2)
    # the roles ran as processes, their logs in the evaluation's dir
    assert (out / "logs" / "controller.log").exists() and (out / "logs" / "env_worker-0.log").exists()


def test_a_model_crossed_with_itself_scores_as_the_model_alone(served, tmp_path: Path) -> None:
    """Cross-sampling end to end at the message level (`RoutedEndpoint`), the endpoint on both sides: under
    greedy decoding every arm plays the same episodes, so single A, single B, mix and cross coincide."""
    from agentrl.evaluation.evaluate import evaluate_cross

    url = served.url()
    scope = EvalScope(("lookup",), "test", samples=3, runs=2, concurrency=3)
    a, b = resolve(f"{url}#policy", label="A"), resolve(f"{url}#policy", label="B")
    md = asyncio.run(evaluate_cross(_lookup_client(), a, b, 0.5, scope, GREEDY, tmp_path, "cross", progress=False))
    curves = json.loads((tmp_path / "cross-curves.json").read_text())["curves"]["lookup"]
    alone = [e.success for e in read_results(tmp_path / "cross-A.jsonl")]
    assert len(alone) == 6 and sum(alone) > 0
    assert curves["single A"][0] == pytest.approx(sum(alone) / 6)
    assert curves["single A"] == curves["single B"] == curves["mix"] == curves["cross"]
    assert "| cross |" in md and {p.name for p in tmp_path.glob("cross-*.jsonl")} == \
        {"cross-A.jsonl", "cross-B.jsonl", "cross-cross.jsonl"}
