"""Trajectories as readable text for TensorBoard's text tab: each span of the conversation decoded, the
policy's own tokens (loss mask 1: its tool calls and answers) told apart from context (prompt,
observations), with the version and engine that sampled them, and how the episode ended. And an
evaluation's transcripts (`eval_transcripts`: messages, not tokens) on a terminal (`pick_transcripts`,
`render_transcript`).

The tokenizer is passed in (anything with `decode(ids, skip_special_tokens=...)`), so the renderers load
no model; `run_tokenizer` loads a run's for the terminal. The rollout role picks which episodes to log
(`pick_per_task`) and logs them with `write_conversations`; `jobs/show_trajectories.py` prints the same
facts on a terminal (`pick_latest`, `render_plain`). Shards are read by the caller's function: monitor
does not import transport (docs/architecture.md §2).
"""
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from agentrl.monitor.tensorboard import MonitorLike
from agentrl.types import Trajectory


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


def spans(t: Trajectory) -> Iterator[tuple[bool, np.ndarray, int, int]]:
    """Maximal runs of equal loss mask: (sampled by the policy?, token ids, policy version, engine);
    version and engine are those of the run's first token (-1 for context)."""
    mask = t.loss_mask.astype(bool)
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            yield bool(mask[start]), t.tokens[start:i], int(t.policy_version[start]), int(t.engine[start])
            start = i


def _indent(text: str) -> str:
    # Four spaces: markdown preformatted text in TensorBoard, so tool-call JSON and tags show as written.
    return "\n".join("    " + line for line in (text.rstrip("\n") or "(empty)").splitlines())


def render_trajectory(t: Trajectory, tokenizer: Decoder) -> str:
    """One episode as TensorBoard markdown: a header line, then every span, then the ending."""
    metrics = ", ".join(f"{k}={v:g}" for k, v in sorted(t.metrics.items()) if isinstance(v, (int, float)))
    lines = [f"**{t.task}** sample `{t.index}` (group `{t.group_id}`, id `{t.traj_id}`)", ""]
    for sampled, ids, version, engine in spans(t):
        text = tokenizer.decode(ids.tolist(), skip_special_tokens=False)
        who = f"policy v{version}, engine {engine}" if sampled else "context"
        lines += [f"*{who}, {len(ids)} tokens:*", "", _indent(text), ""]
    lines.append(f"**ended**: status `{t.status.value}`, reward {t.reward:g}, {t.num_turns} turns, "
                 f"{t.num_tokens} tokens ({t.num_action_tokens} sampled)" + (f"; {metrics}" if metrics else ""))
    return "\n".join(lines)


def pick_per_task(trajs: Sequence[Trajectory], per_task: int) -> dict[str, list[Trajectory]]:
    """The first `per_task` episodes of each task, in the order given, preferring a mix of endings: one
    of each status first, then the rest (a sample of only failures, or only successes, says less)."""
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        by_task[t.task].append(t)
    out: dict[str, list[Trajectory]] = {}
    for task, ts in sorted(by_task.items()):
        first: dict[str, Trajectory] = {}
        for t in ts:
            first.setdefault(t.status.value, t)
        chosen = {id(t) for t in first.values()}
        out[task] = (list(first.values()) + [t for t in ts if id(t) not in chosen])[:per_task]
    return out


def write_conversations(monitor: MonitorLike, trajs: Sequence[Trajectory], tokenizer: Any, step: int,
                        per_task: int = 2, prefix: str = "conversations") -> dict[str, str]:
    """Log a few episodes per task as text under `<prefix>/<task>/<i>` at `step`; returns what it logged."""
    logged = {}
    for task, ts in pick_per_task(trajs, per_task).items():
        for i, t in enumerate(ts):
            tag = f"{prefix}/{task}/{i}"
            logged[tag] = render_trajectory(t, tokenizer)
            monitor.text(tag, logged[tag], step)
    return logged


def render_plain(t: Trajectory, tokenizer: Decoder) -> str:
    """One episode as terminal text: a header, every span (the policy's marked with version and engine),
    then how it ended."""
    lines = [f"=== {t.task} {t.index} (group {t.group_id}, id {t.traj_id})"]
    for sampled, ids, version, engine in spans(t):
        text = tokenizer.decode(ids.tolist(), skip_special_tokens=False)
        if sampled:
            lines += [f"--- policy v{version}, engine {engine}, {len(ids)} tokens:", text.rstrip("\n"), "---"]
        else:
            lines.append(text.rstrip("\n"))
    metrics = ", ".join(f"{k}={v:g}" for k, v in sorted(t.metrics.items()))
    lines.append(f"=== reward {t.reward:g}, status {t.status.value}, {t.num_turns} turns; {metrics}")
    return "\n".join(lines)


def shard_dirs(run_dir: Path, source: str | None = None) -> list[Path]:
    """`shards/<source>` of a run, or (no source) every rollout rank's shard directory."""
    return [run_dir / "shards" / source] if source else sorted((run_dir / "shards").glob("rollout-*"))


def pick_latest(shards: Iterable[Path], read: Callable[[Path], Sequence[Trajectory]], n: int,
                task: str | None = None, status: str | None = None,
                keep: Callable[[Trajectory], bool] | None = None) -> list[Trajectory]:
    """The last `n` trajectories of `task` ending in `status` (None: any) that `keep` keeps, oldest first,
    reading the newest shards (by modification time) first and only as many as it takes."""
    newest_first = sorted(shards, key=lambda p: (p.stat().st_mtime, p.name), reverse=True)
    found: list[Trajectory] = []
    for path in newest_first:
        matching = [t for t in read(path) if (task is None or t.task == task)
                    and (status is None or t.status.value == status) and (keep is None or keep(t))]
        found = matching + found  # an older shard's trajectories come before a newer one's
        if len(found) >= n:
            break
    return found[-n:] if n > 0 else []


def run_tokenizer(run_dir: Path) -> Any:
    """The tokenizer a run's policy speaks: RUN_DIR/model, else `model.path` of its config.yaml."""
    from transformers import AutoTokenizer

    model_dir = run_dir / "model"
    if not model_dir.is_dir():
        from agentrl.config import load_config

        path = load_config(str(run_dir / "config.yaml")).model.path
        model_dir = Path(path) if path else model_dir
    return AutoTokenizer.from_pretrained(str(model_dir))


def pick_transcripts(episodes: Iterable[dict[str, Any]], n: int, task: str | None = None,
                     status: str | None = None, keep: Callable[[dict[str, Any]], bool] | None = None
                     ) -> list[dict[str, Any]]:
    """The first `n` evaluated episodes (`eval_transcripts.read_transcripts`) of `task` ending in `status`
    (None: any) that `keep` keeps, in the order given (0 or less: all of them)."""
    found = [e for e in episodes if (task is None or e["task"] == task) and (status is None or e["status"] == status)
             and (keep is None or keep(e))]
    return found[:n] if n > 0 else found


def _cut(text: str, width: int | None) -> str:
    if width is None or len(text) <= width:
        return text
    return f"{text[:width]}... [{len(text) - width:,} more chars]"


def _message_text(m: dict[str, Any], width: int | None) -> list[str]:
    role = m.get("role", "?")
    content = m.get("content")
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    if role == "assistant":
        lines = [f"--- assistant{' (cut off at the token limit)' if m.get('finish') == 'length' else ''}:"]
        if "raw" in m:  # its calls could not be read: what it wrote, as it wrote it
            lines.append(f"[its calls could not be read; raw text:]\n{m['raw'].rstrip()}")
        elif text.strip():
            lines.append(text.rstrip())
        for call in m.get("tool_calls") or []:
            f = call.get("function", {})
            lines.append(f"-> {f.get('name')}({f.get('arguments')})")
        return lines
    who = role + (f" {m['name']}" if m.get("name") else "") + (", from the loop" if m.get("by") == "loop" else "")
    return [f"[{who}] {_cut(text, width).rstrip()}"]


def render_transcript(e: dict[str, Any], width: int | None = 600, prompt_width: int | None = 300) -> str:
    """One evaluated episode as terminal text: a header, the tools' names, the first messages (each cut at
    `prompt_width` chars), every assistant message (its text and calls in full) and observation (cut at
    `width`; None: in full), then how it ended."""
    head = f"=== {e['task']} {e['index']} (split {e['split']}, sample {e['sample']}" + \
        (f", arm {e['arm']}" if "arm" in e else "") + ")"
    tools = [t.get("function", {}).get("name", "?") for t in e.get("tools") or [] if isinstance(t, dict)]
    lines = [head] + ([f"tools: {', '.join(tools)}"] if tools else [])
    for m in e.get("prompt", []):
        lines += _message_text(m, prompt_width)
    for m in e.get("messages", []):
        lines += _message_text(m, width)
    lines.append(f"=== {e['status']}, success {e['success']:g}, score {e['score']:g}, reward {e['reward']:g}, "
                 f"{e['turns']} turns")
    return "\n".join(lines)
