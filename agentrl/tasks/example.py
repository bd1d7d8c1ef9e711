"""`guess`: the example task of docs/tasks.md, complete. Find a secret number in 1..100 by guessing.

Each `guess(number)` is answered "higher", "lower" or "correct"; a correct guess ends the episode with
reward 1.0, and running out of turns ends it as turn_limit (reward 0.0, set by `Session`). The
scripted expert bisects, so it always wins within 7 guesses. Samples are deterministic in their index.
"""
from __future__ import annotations

import json
import random
from typing import Any

from agentrl.tasks.api import Action, EnvError, Status, StepResult, tool_message

SPLITS = {"train": 1000, "test": 100}
LOW, HIGH = 1, 100

TOOLS = [{"type": "function", "function": {
    "name": "guess",
    "description": f"Guess the secret number ({LOW}..{HIGH}). Answers higher, lower or correct.",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["number"],
                   "properties": {"number": {"type": "integer", "minimum": LOW, "maximum": HIGH}}}}}]


def secret_of(index: str) -> int:
    """The sample behind an index; raises bad_request for an index that is not one."""
    split, _, n = index.partition("-")
    if split not in SPLITS or not n.isdigit() or n != str(int(n)) or int(n) >= SPLITS[split]:
        raise EnvError("bad_request", f"guess has no sample {index!r}")
    return random.Random(f"guess/{index}").randint(LOW, HIGH)  # a str seed: the same in every process


class GuessEpisode:
    """One game. `step` sees only calls that already passed the schema: `number` is an int in range."""

    def __init__(self, secret: int) -> None:
        self.secret = secret
        self.guesses = 0
        self.low, self.high = LOW, HIGH  # what the expert knows so far

    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": "You find numbers by calling the guess tool."},
                {"role": "user", "content": f"I picked a number between {LOW} and {HIGH}. Find it."}]

    def step(self, action: Action) -> StepResult:
        answers = []
        for call in action.tool_calls:  # several calls in one message are answered in order
            number = call.arguments["number"]
            self.guesses += 1
            if number == self.secret:
                answers.append(tool_message(call.id, call.name, "correct"))
                return StepResult(answers, done=True, reward=1.0, status=Status.COMPLETED,
                                  metrics={"success": 1.0, "guesses": float(self.guesses)})
            if number < self.secret:
                self.low = max(self.low, number + 1)
            else:
                self.high = min(self.high, number - 1)
            answers.append(tool_message(call.id, call.name, "higher" if number < self.secret else "lower"))
        return StepResult(answers, metrics={"success": 0.0, "guesses": float(self.guesses)})

    def expert_message(self) -> dict[str, Any]:
        middle = (self.low + self.high) // 2
        return {"role": "assistant", "content": "", "tool_calls": [{
            "id": f"call_{self.guesses}", "type": "function",
            "function": {"name": "guess", "arguments": json.dumps({"number": middle})}}]}


class GuessTask:
    name = "guess"
    max_turns = 10  # bisection needs at most 7

    def tools(self) -> list[dict[str, Any]]:
        return TOOLS

    def indices(self, split: str) -> list[str]:
        if split not in SPLITS:
            raise EnvError("bad_request", f"guess has no split {split!r} (splits: {', '.join(SPLITS)})")
        return [f"{split}-{i}" for i in range(SPLITS[split])]

    def start(self, index: str) -> GuessEpisode:
        return GuessEpisode(secret_of(index))
