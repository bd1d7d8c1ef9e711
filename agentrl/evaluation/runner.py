"""Score the episodes of an `EvalScope` into a resumable results file, at most `concurrency` at once.

    scope     every (task, split, index, sample) to score: the first `samples` indices of each task's split,
              each `runs` times (sample = run 0..k-1), run-major so that an interrupted evaluation holds
              whole runs first
    resume    keys already in the results file are skipped (the same command continues where it stopped)
    score     each episode is appended as one line when it ends; Ctrl-C or a killed job leaves a file of
              whole lines (at worst one cut short, which the reader skips)
    transcript  each episode's conversation is appended to <stem>.transcripts.jsonl.gz just before its line
              (`monitor.eval_transcripts`): a rerun's skipped episodes keep theirs, a replayed one's last wins

Env errors are retried by the players and then written like any other ending: the success rate keeps them
in its denominator and the tables report their rate.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.evaluation.played import Player
from agentrl.evaluation.progress import Progress
from agentrl.monitor.eval_results import Key, ResultsFile
from agentrl.monitor.eval_transcripts import TranscriptFile


@dataclass(frozen=True)
class EvalScope:
    tasks: tuple[str, ...]
    split: str = "test"
    samples: int = 0
    """The first this many indices of each task's split (0: all of them)."""
    runs: int = 4
    """Each index is played this many times (the paper's mean of k runs; pass@k for k <= runs)."""
    concurrency: int = 32


async def scope_keys(client: Any, scope: EvalScope) -> list[Key]:
    """Every key of the scope, run-major: run 0 over every index of every task, then run 1, ..."""
    indices = {}
    for task in scope.tasks:
        idx = list(await client.indices(task, scope.split))
        if not idx:
            raise ValueError(f"task {task!r} has no {scope.split!r} samples")
        indices[task] = idx[: scope.samples] if scope.samples > 0 else idx
    return [(task, scope.split, i, run) for run in range(scope.runs) for task in scope.tasks for i in indices[task]]


async def score(player: Player, keys: Sequence[Key], results: ResultsFile, concurrency: int,
                progress: Progress | None = None, transcripts: TranscriptFile | None = None,
                shared: contextlib.AbstractAsyncContextManager[Any] | None = None, **extra: object) -> int:
    """Play every key not yet in `results` and append each as it ends (its conversation to `transcripts` first,
    where given); returns how many were scored now.

    `shared`: a slot each episode also holds while it plays, taken after one of its own `concurrency` (e.g. an
    `asyncio.Semaphore` several evaluations share, so that together they stay within one engine's batch).
    `extra` goes into every line's `extra` (e.g. the cross-sampling arm). A fatal env error (a misconfigured
    run) cancels the episodes in flight and raises; what was scored before it stays in the file."""
    todo = [k for k in keys if k not in results.done]
    sem = asyncio.Semaphore(concurrency)
    slot = shared if shared is not None else contextlib.nullcontext()
    scored = 0

    async def one(key: Key) -> None:
        nonlocal scored
        task, split, index, sample = key
        async with sem, slot:
            played = await player.play(task, index, f"eval-{task}-{index}-{sample}")
        ep = played.scored(task, split, index, sample, **extra)
        if transcripts is not None and key not in results.done:
            conv = played.conversation
            transcripts.append(ep, conv.messages[:conv.prompt] if conv else [],
                               conv.messages[conv.prompt:] if conv else [], conv.tools if conv else [])
        if results.append(ep):
            scored += 1
            if progress is not None:
                progress.update(ep)

    async with asyncio.TaskGroup() as tg:
        for key in todo:
            tg.create_task(one(key))
    return scored


def progress_for(keys: Sequence[Key], results: ResultsFile, label: str = "", **kwargs: Any) -> Progress:
    """A `Progress` over `keys`, started at the episodes `results` already holds; `label` after each task's name
    in its plain lines (evaluations printing at once, e.g. a task's greedy and sampled runs, told apart; a bar
    keeps its name)."""
    totals = Counter(k[0] for k in keys)
    done = Counter(k[0] for k in keys if k in results.done)
    progress = Progress(totals, done, **kwargs)
    if label:
        for p in progress.tasks.values():
            p.desc = f"{p.desc} {label}"
    return progress
