"""A stand-in model taught a handful of `lookup` episodes, so that evaluations have something to score.

The Qwen2.5-style stand-in (`agentrl.models.standins`, float32 so that two vLLM instances compute the same
greedy tokens) is trained with teacher forcing on the scripted expert's episodes of a few test samples,
played through the real agent loop in the model's own chat format. It then solves those samples greedily
and fails the others: an evaluation of it has successes and failures to compare between paths.

Teaching stops on a margin, not on a step count: a model whose taught token beats the runner-up by a few
hundredths of a logit decodes differently under two engines' float paths (batch shapes, kernels, another
CPU), so a fixed 120 steps that fitted the demos on one machine left ties on another. `build_taught` trains
until every taught token is the argmax by `margin` logits and reports the smallest margin it reached.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import torch

from agentrl.models import standins
from agentrl.rollout.agent_loop import EpisodeLimits, run_episode
from agentrl.rollout.chat import ChatFormat
from agentrl.rollout.engine import ExpertEngine, SamplingConfig
from agentrl.serving.inprocess import InProcessClient
from agentrl.tasks import get_task
from agentrl.types import Trajectory

LIMITS = EpisodeLimits(max_turns=0, max_model_len=1024, max_new_tokens=48)


async def expert_episodes(model_dir: Path, indices: list[str]) -> list[Trajectory]:
    client = InProcessClient({"lookup": get_task("lookup")})
    fmt = ChatFormat.load(model_dir)
    sampling = SamplingConfig(LIMITS.max_new_tokens, 0.0, 1.0, fmt.stop_ids)
    out = []
    for i in indices:
        out.append(await run_episode(client, ExpertEngine(client), fmt, "lookup", i, i, sampling, LIMITS))
    return out


def taught_margin(model: torch.nn.Module, ids: torch.Tensor, attn: torch.Tensor, labels: torch.Tensor) -> float:
    """The smallest, over every taught token, of its logit minus the best other token's (negative: some taught
    token is not the greedy choice)."""
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
    target = labels[:, 1:]
    taught = target != -100
    picked = logits[taught]
    want = target[taught]
    own = picked.gather(1, want[:, None])[:, 0]
    others = picked.scatter(1, want[:, None], float("-inf")).max(dim=1).values
    return float((own - others).min())


def build_taught(out_dir: Path, indices: list[str], margin: float = 2.0, max_steps: int = 600, check_every: int = 20,
                 lr: float = 3e-3) -> tuple[Path, float]:
    """Build the stand-in in `out_dir / "base"`, teach it the expert's episodes of `indices` until every taught
    token wins by `margin` logits (or `max_steps`), save it to `out_dir / "model"`; returns (model dir, the
    smallest margin reached)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.models import tiny

    base = standins.build("qwen2.5", out_dir / "base", dtype="float32")
    demos = asyncio.run(expert_episodes(base, indices))
    assert all(d.metrics["success"] == 1.0 for d in demos)
    tok = AutoTokenizer.from_pretrained(str(base))
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    width = max(d.num_tokens for d in demos)
    pad = tok.pad_token_id or 0
    ids = torch.full((len(demos), width), pad, dtype=torch.long)
    labels = torch.full((len(demos), width), -100, dtype=torch.long)
    attn = torch.zeros((len(demos), width), dtype=torch.long)
    for r, d in enumerate(demos):
        t = torch.as_tensor(d.tokens, dtype=torch.long)
        ids[r, : len(t)] = t
        attn[r, : len(t)] = 1
        m = torch.as_tensor(d.loss_mask, dtype=torch.bool)
        labels[r, : len(t)] = torch.where(m, t, torch.tensor(-100))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    torch.manual_seed(0)
    reached = float("-inf")
    for step in range(1, max_steps + 1):
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % check_every == 0:
            reached = taught_margin(model, ids, attn, labels)
            if reached >= margin:
                break
    out = tiny.save(model, tok, out_dir / "model")
    gen = (base / "generation_config.json").read_bytes()
    (out / "generation_config.json").write_bytes(gen)
    return out, reached
