"""The `kg` task in AgentBench-FC's protocol (`protocol="faithful"`): its loop, rewritten, over our
backends (the local graph or a Freebase SPARQL endpoint).

What AgentBench-FC's `KnowledgeGraph.sync_start_sample` does, and so what this episode does:
  * the system prompt is `INSTRUCTIONS` formatted with the round limit, followed on splits whose config
    says `one_shot: true` (kg-std, the test split) by the `ONE_SHOT` example conversation; both, and the
    tools, come from the checkout's `src/server/tasks/knowledgegraph/const.py`, read at start;
  * every tool call of the message runs, in order; arguments are only `json.loads`-ed and then read by
    the tool's parameter names (`TOOLS_PARAM_ORDER`): a missing one is answered "Arguments do not match
    the function signature. Error processing arguments for <tool>", an unknown tool "Provide an invalid
    function name. Function <tool> does not exist", and any other failure (arguments that do not parse,
    a variable that does not exist, a relation the variable does not have) "Error processing tool call:
    <reason>" (the reason is ours: AgentBench's Python exception text is not reproduced);
  * a message without tool calls is read for "Final Answer: #k" (ending the episode: reward 1 on an
    exact match of the answer sets, AgentBench's `int(is_correct)`); k naming no variable ends it as
    invalid_action (AGENT_VALIDATION_FAILED); without an answer the user message "No valid function
    calls found! Need to recheck the function calls." costs the round.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrl.tasks.agentbench import AgentBenchPrompts, Checkout, PromptSource
from agentrl.tasks.api import Action, StepResult, tool_message
from agentrl.tasks.kg.episode import FINAL_ANSWER, KGEpisode
from agentrl.tasks.kg.program import KGBackend
from agentrl.tasks.kg.samples import KGSample
from agentrl.tasks.protocol import CallPolicy
from agentrl.types import Status

CONST = "src/server/tasks/knowledgegraph/const.py"
CONFIG = "configs/tasks/kg.yaml"
SECTIONS = {"train": "kg-env_train", "test": "kg-std"}
PROMPTS = PromptSource(config=CONFIG, section="default", rounds_key="max_rounds", default_rounds=15, prompt_file=CONST,
                       prompt="INSTRUCTIONS", tools_constant="TOOLS")
"""Where the knowledge-graph server keeps its prompt and tools (`const.py`) and its round limit."""
NO_CALLS = "No valid function calls found! Need to recheck the function calls."


@dataclass(frozen=True)
class KGPrompts(AgentBenchPrompts):
    """The shared prompts (`system` is `INSTRUCTIONS` formatted with the round limit), and what the kg
    server shows besides: its one-shot conversation, the splits that show it, and the order in which
    each tool reads its arguments."""

    one_shot: list[dict[str, Any]]
    one_shot_splits: frozenset[str]
    param_order: dict[str, list[str]]

    @classmethod
    def read(cls, checkout: Checkout, source: PromptSource = PROMPTS) -> KGPrompts:
        base = AgentBenchPrompts.read(checkout, source)
        shots = frozenset(split for split, section in SECTIONS.items()
                          if checkout.task_config(CONFIG, section).get("one_shot"))
        try:
            order = dict(checkout.constant(CONST, "TOOLS_PARAM_ORDER"))
        except KeyError:  # the parameter order is the schema's
            order = {t["function"]["name"]: list(t["function"]["parameters"]["properties"]) for t in base.tools}
        return cls(system=base.system.format(max_round=base.max_rounds), tools=base.tools, max_rounds=base.max_rounds,
                   one_shot=list(checkout.constant(CONST, "ONE_SHOT")), one_shot_splits=shots, param_order=order)


class FaithfulKGEpisode(KGEpisode):
    call_policy = CallPolicy(first_call_only=False, lenient_arguments=True)

    def __init__(self, sample: KGSample, backend: KGBackend, prompts: KGPrompts, one_shot: bool,
                 skilled: bool = True) -> None:
        super().__init__(sample, backend, skilled)
        self.prompts = prompts
        self.one_shot = one_shot

    def initial_messages(self) -> list[dict[str, Any]]:
        shots = [dict(m) for m in self.prompts.one_shot] if self.one_shot else []
        question = f"{self.sample.question}\nEntities: [{', '.join(self.sample.entities)}]"
        return [{"role": "system", "content": self.prompts.system}, *shots,
                {"role": "user", "content": question}]

    def step(self, action: Action) -> StepResult:
        messages = []
        for call in action.tool_calls:
            messages.append(tool_message(call.id, call.name, self._answer(call.name, call.arguments, call.error)))
        return StepResult(messages=messages, metrics={"success": 0.0})

    def _answer(self, name: str, arguments: Any, error: str | None) -> str:
        if error is not None:
            return f"Error processing tool call: {error}"
        if name not in self.prompts.param_order:
            return f"Provide an invalid function name. Function {name} does not exist"
        if not isinstance(arguments, dict):
            return "Error processing tool call: the arguments are not a JSON object"
        if any(k not in arguments for k in self.prompts.param_order[name]):
            return f"Arguments do not match the function signature. Error processing arguments for {name}"
        args = {k: str(arguments[k]) for k in self.prompts.param_order[name]}
        try:
            text = self._run(name, args)
        except ValueError as e:
            return f"Error processing tool call: {e}"
        if self._expert_call(self.expert_done) == (name, args):
            self.expert_done += 1
        return text

    def text_step(self, content: str) -> StepResult | None:
        if not FINAL_ANSWER.search(content.split("Observation:")[0].replace("\\_", "_")):
            return StepResult([{"role": "user", "content": NO_CALLS}], metrics={"success": 0.0})
        result = super().text_step(content)
        if result is not None and result.status == Status.INVALID_ACTION:
            result.messages = []  # AgentBench ends the sample without a word
        return result
