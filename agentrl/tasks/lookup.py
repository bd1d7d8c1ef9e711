"""`lookup`: the smallest task that still needs a tool: look a value up, then submit it.

Built so that a ~1M-parameter model trained from scratch on CPU can learn it in minutes, while it
still has to read the observation: each sample is a catalog of 4 items (the target and 3 distractors)
with random 2-digit fields, and the question asks for one field of one item. Nothing in the question
gives the value away, so the model must call `lookup(name, field)` and copy the value from the tool
result. (An earlier version returned the whole record and left the model to pick the field; a model
this small needed far longer than the demo's budget to learn that two-step lookup.) The question
quotes the field and the name so that each is the very token the tool call needs ("shelf" rather
than " shelf"): a model trained from scratch learns an exact copy far sooner than a mapping. There
are 8 fields, not 3: with 3, a from-scratch model never learned to copy the field within 1,000 warm-start
steps (the field token was worth ln 3 nats of loss against the name's ln 48, and the model settled on
always asking for "code", capping success at 1/3); with 8 it copied the field by step ~600.

Reward (the task's own scale): 1.0 if `submit_answer`'s `answer.strip()` equals the target value
(a 2-digit string), else 0.0. Every ending by `submit_answer` has status "completed" and metrics
{"success": reward}. At most 4 assistant turns; past them the episode ends as "turn_limit" with
reward 0.0 (the trainer applies the failure penalty). The scripted expert solves every sample in two
turns: `lookup(name=<target>, field=<field>)`, then `submit_answer(answer=<value>)`.

Samples are a deterministic function of their index string ("train-0".."train-1999",
"test-0".."test-199"): `random.Random("lookup:<index>")`, so test samples are fresh draws the model
cannot have memorized.
"""
from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass
from typing import Any

from agentrl.tasks.api import Action, EnvError, StepResult, tool_message
from agentrl.tasks.options import SkillOptions
from agentrl.tasks.shared import checked_skill
from agentrl.types import Status

# 48 pseudo-words of two consonant+vowel syllables: short, distinct, and few BPE merges apart.
NAMES: tuple[str, ...] = (
    "lema", "dudi", "rape", "bamo", "dedu", "mazu", "desu", "buro", "bebu", "zeko", "fudu", "kuze",
    "dure", "lapa", "rare", "numi", "nuni", "keve", "tedu", "kuni", "toku", "dapo", "fifo", "masa",
    "vuri", "liro", "roda", "kota", "bisu", "soko", "sibo", "lera", "nagi", "femo", "zode", "nopi",
    "fozu", "kolo", "gede", "fese", "bozu", "fika", "fopi", "rule", "tura", "numo", "modo", "sobe",
)
FIELDS: tuple[str, ...] = ("code", "shelf", "price", "stock", "size", "color", "weight", "rank")
SPLIT_SIZES: dict[str, int] = {"train": 2000, "test": 200}
CATALOG_SIZE = 4
SYSTEM_PROMPT = "You are an agent. Use the tools to answer."

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "lookup", "description": "Show one field of an item.",
        "parameters": {"type": "object", "properties": {"name": {"type": "string"},
                                                        "field": {"type": "string", "enum": list(FIELDS)}},
                       "required": ["name", "field"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "submit_answer", "description": "Submit the final answer.",
        "parameters": {"type": "object", "properties": {"answer": {"type": "string"}},
                       "required": ["answer"], "additionalProperties": False}}},
]


@dataclass(frozen=True)
class Sample:
    catalog: dict[str, dict[str, str]]  # name -> {field: 2-digit value}
    target: str
    field: str

    @property
    def answer(self) -> str:
        return self.catalog[self.target][self.field]


def make_sample(index: str) -> Sample:
    """The sample behind an index; raises EnvError(bad_request) for an index of no split."""
    split, _, num = index.rpartition("-")
    if split not in SPLIT_SIZES or not num.isdigit() or int(num) >= SPLIT_SIZES[split] or num != str(int(num)):
        raise EnvError("bad_request", f"lookup has no sample {index!r}")
    rng = random.Random(f"lookup:{index}")
    names = rng.sample(NAMES, CATALOG_SIZE)
    catalog = {n: {f: str(rng.randint(10, 99)) for f in FIELDS} for n in names}
    return Sample(catalog=catalog, target=rng.choice(names), field=rng.choice(FIELDS))


class LookupEpisode:
    def __init__(self, sample: Sample, expert_field: str | None = None) -> None:
        self.sample = sample
        self.expert_field = expert_field or sample.field  # the field the expert asks for (a wrong one if unskilled)
        self.looked_up = False  # whether the expert's lookup has been answered (drives the expert)
        self.expert_turn = 0

    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": f"What is the \"{self.sample.field}\" of \"{self.sample.target}\"?"}]

    def step(self, action: Action) -> StepResult:
        messages: list[dict[str, Any]] = []
        for call in action.tool_calls:
            if call.name == "submit_answer":
                reward = 1.0 if call.arguments["answer"].strip() == self.sample.answer else 0.0
                messages.append(tool_message(call.id, call.name, "Answer submitted."))
                # calls after the submission in the same message are ignored: the episode is over
                return StepResult(messages=messages, done=True, reward=reward, status=Status.COMPLETED,
                                  metrics={"success": reward})
            messages.append(tool_message(call.id, call.name,
                                         self._lookup(call.arguments["name"], call.arguments["field"])))
        return StepResult(messages=messages, metrics={"success": 0.0})

    def _lookup(self, name: str, field: str) -> str:
        record = self.sample.catalog.get(name.strip())
        if record is None:
            return f"Error: no item named {name!r}."
        if name.strip() == self.sample.target and field == self.expert_field:
            self.looked_up = True
        return record[field]

    def expert_message(self) -> dict[str, Any]:
        if self.looked_up:
            name, args = "submit_answer", {"answer": self.sample.catalog[self.sample.target][self.expert_field]}
        else:
            name, args = "lookup", {"name": self.sample.target, "field": self.expert_field}
        call_id = f"call_{self.expert_turn}"
        self.expert_turn += 1
        return {"role": "assistant", "content": "", "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


class LookupTask:
    name = "lookup"
    Options = SkillOptions  # what `envs.task_options.lookup` may hold, checked at load
    max_turns = 4
    isolation = "thread"  # bounded dictionary look-ups: no process per session (agentrl.serving.isolation)

    def __init__(self, expert_skill: float = 1.0) -> None:
        self.expert_skill = checked_skill("lookup", expert_skill)

    def tools(self) -> list[dict[str, Any]]:
        return copy.deepcopy(TOOLS)  # callers may mutate their copy, never the schemas

    def indices(self, split: str) -> list[str]:
        if split not in SPLIT_SIZES:
            raise EnvError("bad_request", f"lookup has no split {split!r} (splits: {', '.join(SPLIT_SIZES)})")
        return [f"{split}-{i}" for i in range(SPLIT_SIZES[split])]

    def start(self, index: str) -> LookupEpisode:
        sample = make_sample(index)
        rng = random.Random(f"lookup-expert:{index}")  # the expert's draws, fixed per sample
        skilled = rng.random() < self.expert_skill
        field = sample.field if skilled else rng.choice([f for f in FIELDS if f != sample.field])
        return LookupEpisode(sample, field)
