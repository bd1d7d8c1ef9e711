"""An evaluation's transcripts: every scored episode's conversation, beside its results file, and as text.

    OUT/<stem>.jsonl                     one line per scored episode (`eval_results`)
    OUT/<stem>.transcripts.jsonl.gz      one line per episode: its messages, calls and observations

One episode is one JSON line with the results line's key and outcome (task, split, index, sample, status,
success, score, reward, turns) and its conversation: `prompt`, the env's first messages, `messages`, what
followed (each assistant message with its parsed `tool_calls`, its `raw` text where the calls could not be
read; each observation, `by: "loop"` where the loop answered rather than the env), and `tools`. What every
episode of a task repeats (the system prompt, the tool schemas, a long instruction) is written once, as a
line `{"shared": ID, "value": ...}`, and referred to as `{"shared": ID}` (ID: a hash of the value).

Each episode is appended as its own gzip member (its new shared lines with it), flushed and fsynced after
the episode is played and before its results line. So an interrupted evaluation leaves a file whose whole
members read (`read_transcripts` skips a last member cut short; `TranscriptFile` cuts it off before
appending); an episode whose transcript was written but whose results line was not is played again by the
rerun, and the reader keeps the last transcript of a key. Standard library only.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from agentrl.monitor.eval_results import Key, ScoredEpisode

SHARED_MIN_CHARS = 200
"""A first message at least this long (as JSON) is written once and referred to; shorter ones inline."""


def transcripts_path(results: str | os.PathLike[str]) -> Path:
    """OUT/<stem>.transcripts.jsonl.gz beside OUT/<stem>.jsonl."""
    p = Path(results)
    return p.with_name(p.name.removesuffix(".jsonl") + ".transcripts.jsonl.gz")


def _id(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha1(text.encode("utf-8", "replace")).hexdigest()[:16]


def _members(f: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """Each whole gzip member of `f` in turn: (offset just past it, its text); stops at a member cut short."""
    d, out, done, pending = zlib.decompressobj(31), [], 0, b""
    while True:
        chunk = pending or f.read(1 << 16)
        pending = b""
        if not chunk:
            return
        try:
            out.append(d.decompress(chunk))
        except zlib.error:
            return
        if d.eof:
            pending = d.unused_data
            done += len(chunk) - len(pending)
            yield done, b"".join(out)
            d, out = zlib.decompressobj(31), []
        else:
            done += len(chunk)


def _lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with open(path, "rb") as f:
        for end, text in _members(f):
            for line in text.decode("utf-8").splitlines():
                if line.strip():
                    yield end, json.loads(line)


def read_transcripts(path: str | os.PathLike[str], resolve: bool = True) -> list[dict[str, Any]]:
    """Every episode of a transcripts file (a missing file is empty), in the order written, the last of a key
    kept (a replayed episode's); `resolve` puts the shared values back in place of their references."""
    p = Path(path)
    if not p.exists():
        return []
    shared: dict[str, Any] = {}
    episodes: dict[Key, dict[str, Any]] = {}
    for _, rec in _lines(p):
        if "shared" in rec:
            shared[rec["shared"]] = rec["value"]
            continue
        key = (rec["task"], rec["split"], rec["index"], int(rec["sample"]))
        episodes.pop(key, None)
        episodes[key] = _resolved(rec, shared) if resolve else rec
    return list(episodes.values())


def _resolved(rec: dict[str, Any], shared: dict[str, Any]) -> dict[str, Any]:
    def value(x: Any) -> Any:
        return shared.get(x["shared"], x) if isinstance(x, dict) and set(x) == {"shared"} else x

    return {**rec, "tools": value(rec.get("tools", [])), "prompt": [value(m) for m in rec.get("prompt", [])]}


class TranscriptFile:
    """The append side: one gzip member per episode, each shared value written once per file.

        with TranscriptFile(transcripts_path(results_path)) as tf:
            tf.append(scored_episode, prompt, messages, tools)
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.shared: set[str] = set()
        whole = 0
        if self.path.exists():
            for end, rec in _lines(self.path):
                whole = end
                if "shared" in rec:
                    self.shared.add(rec["shared"])
            if whole < self.path.stat().st_size:  # a member cut short by a kill: dropped before appending
                os.truncate(self.path, whole)
        self._f: BinaryIO = open(self.path, "ab")  # closed in close()

    def _ref(self, value: Any, new: list[dict[str, Any]]) -> Any:
        sid = _id(value)
        if sid not in self.shared:
            self.shared.add(sid)
            new.append({"shared": sid, "value": value})
        return {"shared": sid}

    def append(self, ep: ScoredEpisode, prompt: list[dict[str, Any]], messages: list[dict[str, Any]],
               tools: list[dict[str, Any]]) -> None:
        """Write one episode's transcript (its shared values first, in the same member)."""
        new: list[dict[str, Any]] = []
        rec = {"task": ep.task, "split": ep.split, "index": ep.index, "sample": ep.sample, "status": ep.status,
               "success": ep.success, "score": ep.score, "reward": ep.extra.get("reward", ep.score),
               "turns": ep.turns, **({"arm": ep.extra["arm"]} if "arm" in ep.extra else {}),
               "tools": self._ref(tools, new) if tools else [],
               "prompt": [self._ref(m, new) if len(json.dumps(m, ensure_ascii=False)) >= SHARED_MIN_CHARS else m
                          for m in prompt],
               "messages": messages}
        # default=str: an in-process task's odd value is shown, not fatal; "replace": an env's unpaired surrogate
        # (invalid UTF-8) becomes "?", so the file stays UTF-8 that any reader takes
        text = "".join(json.dumps(x, ensure_ascii=False, default=str) + "\n" for x in (*new, rec))
        self._f.write(gzip.compress(text.encode("utf-8", "replace"), mtime=0))  # one write of a whole member
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> TranscriptFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
