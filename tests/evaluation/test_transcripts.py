"""The evaluation's transcripts, through each player: the scripted expert target (message level), a local
engine through the rollout's agent loop (the expert as an engine, and a scripted one writing a malformed
call), an endpoint's cut-off and unreadable replies; and a rerun that skips scored episodes."""
from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path

from agentrl.evaluation.endpoint import Reply
from agentrl.evaluation.evaluate import Settings, evaluate, score_into
from agentrl.evaluation.players import EndpointPlayer, LocalPlayer
from agentrl.evaluation.runner import EvalScope, scope_keys
from agentrl.evaluation.targets import resolve
from agentrl.models import tiny_chat as chat
from agentrl.monitor.eval_results import read_results
from agentrl.monitor.eval_transcripts import read_transcripts
from agentrl.rollout.agent_loop import CONVERSATION, EpisodeLimits
from agentrl.rollout.collect import Retry
from agentrl.rollout.engine import ExpertEngine, SamplingConfig
from agentrl.serving.inprocess import InProcessClient
from agentrl.tasks import get_task
from agentrl.tasks.lookup import make_sample
from tests.rollout.scripted_engine import ScriptedEngine

LIMITS = EpisodeLimits(max_turns=0, max_model_len=1024, max_new_tokens=48)
SETTINGS = Settings(temperature=0.0, top_p=1.0, limits=LIMITS, retry=Retry(max_retries=0))


def _client() -> InProcessClient:
    return InProcessClient({"lookup": get_task("lookup")})


def _calls(messages: list[dict]) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for m in messages if m["role"] == "assistant" for c in m.get("tool_calls", [])]


def _expert_episode_ok(e: dict) -> None:
    """The lookup expert's episode: lookup(target, field) -> the answer, then submit_answer(answer)."""
    s = make_sample(e["index"])
    assert _calls(e["messages"]) == [("lookup", {"name": s.target, "field": s.field}),
                                     ("submit_answer", {"answer": s.answer})]
    observations = [m for m in e["messages"] if m["role"] == "tool"]
    assert observations[0]["content"] == s.answer and observations[0]["name"] == "lookup"
    assert e["prompt"][-1]["role"] == "user" and s.target in e["prompt"][-1]["content"]
    assert [t["function"]["name"] for t in e["tools"]] == ["lookup", "submit_answer"]
    assert (e["status"], e["success"], e["reward"], e["turns"]) == ("completed", 1.0, 1.0, 2)


def test_expert_target_writes_one_transcript_per_episode(tmp_path: Path) -> None:
    scope = EvalScope(("lookup",), "test", samples=3, runs=2, concurrency=3)
    asyncio.run(evaluate(_client(), resolve("expert"), scope, SETTINGS, tmp_path, "eval-test", progress=False))
    eps = read_transcripts(tmp_path / "eval-test.transcripts.jsonl.gz")
    assert sorted((e["index"], e["sample"]) for e in eps) == [(f"test-{i}", s) for i in range(3) for s in (0, 1)]
    for e in eps:
        _expert_episode_ok(e)
    raw = [json.loads(x) for x in gzip.decompress((tmp_path / "eval-test.transcripts.jsonl.gz").read_bytes())
           .decode().splitlines()]
    assert sum("shared" in x for x in raw) == 1  # the tool schemas, once for the six episodes
    assert all(x["tools"] == {"shared": raw[0]["shared"]} for x in raw[1:])


def test_rerun_skipping_scored_episodes_keeps_one_transcript_each(tmp_path: Path) -> None:
    out = tmp_path / "out"
    for samples in (2, 4, 4):  # two more indices, then nothing left to play
        scope = EvalScope(("lookup",), "test", samples=samples, runs=2, concurrency=2)
        asyncio.run(evaluate(_client(), resolve("expert"), scope, SETTINGS, out, "eval-test", progress=False))
    path = out / "eval-test.transcripts.jsonl.gz"
    lines = [json.loads(x) for x in gzip.decompress(path.read_bytes()).decode().splitlines()]
    keys = [(x["index"], x["sample"]) for x in lines if "shared" not in x]
    assert sorted(keys) == sorted({(e.index, e.sample) for e in read_results(out / "eval-test.jsonl")})
    assert len(keys) == len(set(keys)) == 8  # one line per episode: none lost, none written twice
    assert sum("shared" in x for x in lines) == 1  # the rerun knew the schemas were written


def test_local_player_records_the_agent_loops_messages(lookup_format, tmp_path: Path) -> None:
    fmt = lookup_format
    client = _client()
    sampling = SamplingConfig(48, 0.0, 1.0, fmt.stop_ids)
    scope = EvalScope(("lookup",), "test", samples=2, runs=1, concurrency=1)
    keys = asyncio.run(scope_keys(client, scope))
    expert = LocalPlayer(client, ExpertEngine(client), fmt, sampling, LIMITS, Retry(max_retries=0))
    asyncio.run(score_into(expert, keys, tmp_path / "expert.jsonl", {}, 1, False))
    eps = read_transcripts(tmp_path / "expert.transcripts.jsonl.gz")
    assert len(eps) == 2
    for e in eps:
        _expert_episode_ok(e)

    s = make_sample("test-0")
    bad = '<tool_call>{"name": "lookup", "arguments": {"name": </tool_call>' + chat.IM_END
    good = (f'{chat.CALL_START}{{"name": "submit_answer", "arguments": {{"answer": "{s.answer}"}}}}{chat.CALL_END}'
            + chat.IM_END)
    scripted = LocalPlayer(client, ScriptedEngine([bad, good], fmt.tokenizer), fmt, sampling, LIMITS,
                           Retry(max_retries=0))
    asyncio.run(score_into(scripted, keys[:1], tmp_path / "scripted.jsonl", {}, 1, False))
    (e,) = read_transcripts(tmp_path / "scripted.transcripts.jsonl.gz")
    first, error, second, done = e["messages"]
    assert "tool_calls" not in first and first["raw"].startswith('<tool_call>{"name": "lookup"')
    assert error["by"] == "loop" and "not valid JSON" in error["content"]  # the loop's answer, not the env's
    assert _calls([second]) == [("submit_answer", {"answer": s.answer})] and "by" not in done
    assert (e["status"], e["success"], e["turns"]) == ("completed", 1.0, 2)
    assert CONVERSATION.get() is None  # the player's recording does not outlive its episode


class Scripted:
    def __init__(self, replies: list[Reply]) -> None:
        self.replies = replies

    async def reply(self, *a: object) -> Reply:
        return self.replies.pop(0)


def test_endpoint_player_marks_cut_off_and_unreadable_turns(tmp_path: Path) -> None:
    client = _client()
    replies = [Reply({"role": "assistant", "content": "let me think"}, "length", 100, 48),
               Reply({"role": "assistant", "content": '<tool_call>{"name": '}, "stop", 150, 5),
               Reply({"role": "assistant", "content": "no idea"}, "stop", 160, 2),
               Reply({"role": "assistant", "content": "none"}, "stop", 170, 1)]
    player = EndpointPlayer(client, Scripted(replies), 0.0, 1.0, LIMITS, Retry(max_retries=0))
    keys = asyncio.run(scope_keys(client, EvalScope(("lookup",), "test", samples=1, runs=1)))
    asyncio.run(score_into(player, keys, tmp_path / "ep.jsonl", {}, 1, False))
    (e,) = read_transcripts(tmp_path / "ep.transcripts.jsonl.gz")
    m = e["messages"]
    assert m[0] == {"role": "assistant", "content": "let me think", "finish": "length"}
    assert m[1]["by"] == "loop" and "cut off" in m[1]["content"]
    assert m[3]["by"] == "loop" and m[3]["role"] == "tool"  # the unreadable call, answered without the env
    assert "by" not in m[5] and e["status"] == "turn_limit" and e["turns"] == 4
