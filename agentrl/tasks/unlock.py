"""`unlock`: open a safe whose code is written on a note. The smallest task where gathering information
first pays: read the note, then enter the code it shows.

Each sample hides one code word (16 words, one token each for the tiny model's tokenizer). The tools:
`read_note()` answers the bare code word (the exact token `enter_code` needs: a copy, not a mapping);
`enter_code(code)` ends the episode: reward 1.0 if `code` equals the hidden word (after stripping), else
0.0, status "completed", metrics {"success": reward, "read_note": 1.0 if the note was read before the code
was entered}. At most 4 assistant turns.

The scripted expert has a skill (task option `expert_skill`, default 1.0): with that probability (drawn
per sample, from the index) it reads the note and enters its code; otherwise it enters a guess at once
(right by chance 1 time in 16). Demonstrations of an expert with skill 0.5 teach a policy that reads the
note about half the time: imitation cannot do better than its teacher, reward can — the demo's RL gain.

Samples are a deterministic function of their index ("train-0".."train-1999", "test-0".."test-199").
"""
from __future__ import annotations

import copy
import json
import random
from typing import Any

from agentrl.tasks.api import Action, EnvError, StepResult, tool_message
from agentrl.tasks.options import SkillOptions
from agentrl.tasks.shared import checked_skill
from agentrl.types import Status

WORDS: tuple[str, ...] = ("red", "blue", "green", "black", "white", "pink", "gold", "gray",
                          "brown", "navy", "teal", "lime", "rose", "sand", "jade", "mint")
SPLIT_SIZES: dict[str, int] = {"train": 2000, "test": 200}
SYSTEM_PROMPT = "You are an agent. Use the tools to answer."
QUESTION = "Open the safe."

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "read_note", "description": "Read the note by the safe.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "enter_code", "description": "Enter a code; a wrong one ends the game.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                       "required": ["code"], "additionalProperties": False}}},
]


def code_of(index: str) -> str:
    """The hidden code of a sample; raises EnvError(bad_request) for an index of no split."""
    split, _, num = index.rpartition("-")
    if split not in SPLIT_SIZES or not num.isdigit() or num != str(int(num)) or int(num) >= SPLIT_SIZES[split]:
        raise EnvError("bad_request", f"unlock has no sample {index!r}")
    return random.Random(f"unlock:{index}").choice(WORDS)


class UnlockEpisode:
    def __init__(self, index: str, expert_skill: float) -> None:
        self.code = code_of(index)
        rng = random.Random(f"unlock-expert:{index}")  # the expert's draws, fixed per sample
        self.expert_reads = rng.random() < expert_skill
        self.expert_guess = rng.choice(WORDS)
        self.note_read = False
        self.expert_turn = 0

    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": QUESTION}]

    def step(self, action: Action) -> StepResult:
        messages: list[dict[str, Any]] = []
        for call in action.tool_calls:
            if call.name == "enter_code":
                reward = 1.0 if call.arguments["code"].strip() == self.code else 0.0
                messages.append(tool_message(call.id, call.name, "The safe opens." if reward else "Wrong code."))
                return StepResult(messages=messages, done=True, reward=reward, status=Status.COMPLETED,
                                  metrics={"success": reward, "read_note": float(self.note_read)})
            self.note_read = True
            messages.append(tool_message(call.id, call.name, self.code))  # the bare word: the very token to enter
        return StepResult(messages=messages, metrics={"success": 0.0, "read_note": float(self.note_read)})

    def expert_message(self) -> dict[str, Any]:
        if self.expert_reads and not self.note_read:
            name, args = "read_note", {}
        else:
            name, args = "enter_code", {"code": self.code if self.note_read else self.expert_guess}
        call_id = f"call_{self.expert_turn}"
        self.expert_turn += 1
        return {"role": "assistant", "content": "", "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


class UnlockTask:
    name = "unlock"
    Options = SkillOptions  # what `envs.task_options.unlock` may hold, checked at load
    max_turns = 4
    isolation = "thread"  # bounded look-ups: no process per session (agentrl.serving.isolation)

    def __init__(self, expert_skill: float = 1.0) -> None:
        self.expert_skill = checked_skill("unlock", expert_skill)

    def tools(self) -> list[dict[str, Any]]:
        return copy.deepcopy(TOOLS)

    def indices(self, split: str) -> list[str]:
        if split not in SPLIT_SIZES:
            raise EnvError("bad_request", f"unlock has no split {split!r} (splits: {', '.join(SPLIT_SIZES)})")
        return [f"{split}-{i}" for i in range(SPLIT_SIZES[split])]

    def start(self, index: str) -> UnlockEpisode:
        return UnlockEpisode(index, self.expert_skill)
