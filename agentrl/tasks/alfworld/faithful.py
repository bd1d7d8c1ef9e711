"""The `alfworld` task in AgentBench-FC's protocol (`protocol="faithful"`): its loop, rewritten.

What AgentBench-FC's `ALFWorld.alfworld_run` does each round, and so what this episode does:
  * only the first tool call of a message counts; its first argument's value, whatever its key, is the
    action (AgentBench's `list(arguments.values())[0]`), and the tool's name is not looked at;
  * the action is lower-cased, cut at its first line, and, when it is not admissible, replaced by the
    admissible command closest to it by sentence BLEU (NLTK's, smoothing method 4) when that scores
    above 0.01 (`utils.process_action`); `bleu` below is our implementation of that score;
  * the answer is the game's reply (a leading "You arrive at loc N. " cut) and " AVAILABLE ACTIONS: ..."
    as a tool message;
  * a message without tool calls gets the user message "No executable tool calls found. Please call a
    tool instead", one whose first call cannot be read "No valid tool calls found. Please call a tool
    instead."; both cost the round;
  * the same raw action three times in a row, from the fourth move on, ends the game as a failure
    (reward 0; here status invalid_action); the game's end gives reward 1 if won.
The system prompt (`get_task_instruction`) is read from the checkout's `src/server/tasks/alfworld/task.py`
and the tool from `configs/tasks/alfworld.yaml`. The first user message is built as AgentBench builds
it from ALFWorld's first observation (the welcome banner dropped, the rest joined line by line).
"""
from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from agentrl.tasks.agentbench import AgentBenchPrompts, PromptSource
from agentrl.tasks.alfworld.episode import AlfworldEpisode, available, clean
from agentrl.tasks.api import Action, StepResult, tool_message
from agentrl.tasks.protocol import CallPolicy, first_value
from agentrl.types import Status

TASK_FILE = "src/server/tasks/alfworld/task.py"
CONFIG = "configs/tasks/alfworld.yaml"
NO_CALLS = "No executable tool calls found. Please call a tool instead"
BAD_CALL = "No valid tool calls found. Please call a tool instead."
SNAP_LIMIT = 0.01


PROMPTS = PromptSource(config=CONFIG, section="alfworld-std", rounds_key="max_step", default_rounds=20,
                       prompt_file=TASK_FILE, prompt="get_task_instruction", returned=True)
"""Where the ALFWorld server keeps its prompt (what `get_task_instruction` returns), tool and round limit."""


def _ngrams(tokens: list[str], n: int) -> Counter[tuple[str, ...]]:
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def bleu(reference: str, candidate: str) -> float:
    """Sentence BLEU-4 of `candidate` against one `reference` (whitespace tokens, uniform weights,
    brevity penalty), with Chen & Cherry's smoothing 4 for n-gram orders without a match (k = 5),
    orders whose precision stays 0 left out, and 0 when no word matches: NLTK's `sentence_bleu` with
    `SmoothingFunction().method4`, as AgentBench-FC calls it."""
    ref, hyp = reference.split(), candidate.split()
    if not hyp:
        return 0.0
    precisions: list[float] = []
    matches: list[int] = []
    for n in range(1, 5):
        counts, ref_counts = _ngrams(hyp, n), _ngrams(ref, n)
        matches.append(sum(min(c, ref_counts[g]) for g, c in counts.items()))
        precisions.append(matches[-1] / max(1, sum(counts.values())))
    if matches[0] == 0:
        return 0.0
    step = 1
    for n in range(4):
        if matches[n] == 0 and len(hyp) > 1:
            precisions[n] = 1 / (2 ** step * 5 / math.log(len(hyp))) / max(1, sum(_ngrams(hyp, n + 1).values()))
            step += 1
    penalty = 1.0 if len(hyp) > len(ref) else math.exp(1 - len(ref) / len(hyp))
    return penalty * math.exp(math.fsum(0.25 * math.log(p) for p in precisions if p > 0))


def process_action(action: str, choices: list[str]) -> str:
    """AgentBench's reading of an action: lower-cased first line, else the closest admissible command."""
    action = action.strip().lower().split("\n")[0]
    if not choices or action in choices:
        return action
    scores = [bleu(choice, action) for choice in choices]
    best = max(range(len(choices)), key=lambda i: (scores[i], -i))
    return choices[best] if scores[best] > SNAP_LIMIT else action


def process_ob(observation: str) -> str:
    if observation.startswith("You arrive at loc "):
        observation = observation[observation.find(". ") + 2:]
    return observation


class FaithfulAlfworldEpisode(AlfworldEpisode):
    call_policy = CallPolicy(first_call_only=True, lenient_arguments=True)

    def __init__(self, game: Path, prompts: AgentBenchPrompts, skilled: bool = True) -> None:
        super().__init__(game, skilled)
        self.prompts = prompts
        self.outputs: list[str] = []  # the raw actions played (AgentBench's repeat check)

    def initial_messages(self) -> list[dict[str, Any]]:
        intro = clean(self.state.description or "")
        goal = (self.state.objective or "").strip()
        text = "Here is your task. " + "\n".join([intro, f"Your task is to: {goal}"]) + available(self.commands)
        return [{"role": "system", "content": self.prompts.system}, {"role": "user", "content": text}]

    def text_step(self, content: str) -> StepResult:
        return StepResult([{"role": "user", "content": NO_CALLS}], metrics={"success": 0.0})

    def step(self, action: Action) -> StepResult:
        call = action.tool_calls[0]
        try:
            output = first_value(call.arguments)
            command = process_action(output, self.commands)
        except (ValueError, AttributeError):  # AgentBench: any failure reading the call
            return StepResult([{"role": "user", "content": BAD_CALL}], metrics={"success": 0.0})
        reply, done = self.play(command if command in self.commands else None)
        self.outputs.append(output)
        messages = [tool_message(call.id, call.name, process_ob(reply) + available(self.commands))]
        if len(self.outputs) > 3 and len(set(self.outputs[-3:])) == 1:
            self.close()
            return StepResult(messages, done=True, status=Status.INVALID_ACTION, metrics={"success": 0.0})
        won = bool(self.state.won)
        if done or won or self.state.lost:
            self.close()
            return StepResult(messages, done=True, reward=float(won), status=Status.COMPLETED,
                              metrics={"success": float(won)})
        return StepResult(messages, metrics={"success": 0.0})
