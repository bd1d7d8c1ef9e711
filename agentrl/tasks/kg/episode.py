"""One `kg` episode in this project's protocol ("strict"): variables built by tool calls, then
"Final Answer: #k". The tool schemas are AgentBench-FC's."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from agentrl.tasks.api import Action, StepResult, tool_message
from agentrl.tasks.kg.program import MAX_PROGRAM_NODES, NUMBER_TYPE, KGBackend, Program, program_size
from agentrl.tasks.kg.samples import KGSample
from agentrl.tasks.shared import call_message, text_message
from agentrl.types import Status

MAX_ROUNDS = 15

INSTRUCTIONS = f"""You answer questions from a knowledge base (KB) by calling the tools that query it.
- A variable is an entity or a set of entities produced by an earlier query. Variables are numbered
  from 0 in the order they are made: #0 is the first, #1 the second, and so on.
- Look up the relations of an entity or variable before following one with get_neighbors, and its
  attributes before argmax or argmin.
- Call one tool at a time and read its observation before the next call.
- When a variable is the answer, reply without calling a tool: 'Final Answer: #id' (for example
  'Final Answer: #3').
- You have at most {MAX_ROUNDS} rounds."""


def _tool(name: str, description: str, params: dict[str, str]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object",
                       "properties": {k: {"type": "string", "description": d} for k, d in params.items()},
                       "required": list(params), "additionalProperties": False}}}


# AgentBench-FC's tool schemas (src/server/tasks/knowledgegraph/const.py, Apache-2.0, see
# data/agentbench/LICENSE): names, parameters, their order and descriptions as there, so that a model
# sees the same interface here and in AgentBench.
TOOLS: list[dict[str, Any]] = [
    _tool("get_relations", "Fetches all relations associated with a given entity or variable, which helps in "
          "navigating the Knowledge Base (KB) to find useful connections.",
          {"variable": "The entity or variable whose relations are to be fetched. Should be an existing entity or a "
                       "result of a previous query."}),
    _tool("get_neighbors", "Returns all entities connected to a given variable through a specified relation, can only "
          "be used after identifying valid relations with get_relations().",
          {"variable": "The subject entity or variable to find neighbors for.",
           "relation": "The relationship through which neighbors are connected to the subject."}),
    _tool("intersection", "Computes the intersection of two sets of entities or variables of the same type.",
          {"variable1": "The first set of entities or a variable.",
           "variable2": "The second set of entities or a variable."}),
    _tool("get_attributes", "Retrieves all numerical attributes of a given variable, especially valuable when seeking "
          "for entities with extreme attributes (max or min).",
          {"variable": "The variable whose numerical attributes are to be fetched."}),
    _tool("argmax", "Finds the entity with the maximum value of the specified attribute, can be used after identifying "
          "valid attributes with get_attributes().",
          {"variable": "The variable or set of entities among which to find the maximum.",
           "attribute": "The attribute to maximize over the entities."}),
    _tool("argmin", "Finds the entity with the minimum value of the specified attribute, can be used after identifying "
          "valid attributes with get_attributes().",
          {"variable": "The variable or set of entities among which to find the minimum.",
           "attribute": "The attribute to minimize over the entities."}),
    _tool("count", "Counts the number of entities within a given variable.",
          {"variable": "The variable or set of entities to count."}),
]
PARAM_ORDER: dict[str, list[str]] = {
    t["function"]["name"]: list(t["function"]["parameters"]["properties"]) for t in TOOLS}


FINAL_ANSWER = re.compile(r"(?:Find|Final) Answer: #(\d+)")
MAX_VARIABLE_DIGITS = 9  # a variable number longer than this names none (and is never converted)
ENTITY_ID = re.compile(r"^[a-z]\.[A-Za-z0-9_]+$")
LOOKUPS = ("get_relations", "get_attributes")  # the tools that show something and make no variable


@dataclass(frozen=True)
class Variable:
    type: str
    program: Program


def f1_score(predicted: set[str], gold: set[str]) -> float:
    """AgentBench's F1 between the predicted and gold answer sets (0.0 when they share nothing)."""
    tp = len(predicted & gold)
    if tp == 0:
        return 0.0
    precision, recall = tp / len(predicted), tp / len(gold)
    return 2 * precision * recall / (precision + recall)


def parse_action(action: str) -> tuple[str, dict[str, str]]:
    """"get_neighbors(#0, film.film.genre)" -> ("get_neighbors", {"variable": "#0", "relation": ...})."""
    m = re.fullmatch(r"\s*(\w+)\((.*)\)\s*", action)
    if not m or m.group(1) not in PARAM_ORDER:
        raise ValueError(f"not a kg action: {action!r}")
    names = PARAM_ORDER[m.group(1)]
    args = [a.strip() for a in m.group(2).split(",")] if len(names) > 1 else [m.group(2).strip()]
    if len(args) != len(names):
        raise ValueError(f"{m.group(1)} takes {len(names)} arguments: {action!r}")
    return m.group(1), dict(zip(names, args))


class KGEpisode:
    def __init__(self, sample: KGSample, backend: KGBackend, skilled: bool = True) -> None:
        self.sample = sample
        self.backend = backend
        self.variables: list[Variable] = []
        # what get_relations / get_attributes showed, per program: AgentBench refuses get_neighbors and
        # argmax/argmin with a relation or attribute not fetched first for that same variable
        self.shown_relations: dict[Program, set[str]] = {}
        self.shown_attributes: dict[Program, set[str]] = {}
        self.names = {eid: name for name, eid in sample.entities.items()}
        self.expert_done = 0  # how many of the sample's `actions` have run (the expert's place in them)
        self.skilled = skilled  # False: the expert answers before it has what the answer needs (`_hasty_plan`)
        self._hasty: tuple[int, str | None] | None = None

    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": INSTRUCTIONS},
                {"role": "user", "content": f"{self.sample.question}\nEntities: [{', '.join(self.sample.entities)}]"}]

    # ------------------------------------------------------------------------------------ actions

    def step(self, action: Action) -> StepResult:
        messages = []
        for call in action.tool_calls:
            try:
                text = self._run(call.name, call.arguments)
            except ValueError as e:
                text = f"Error: {call.name} cannot be executed: {e}"
            else:
                if self._expert_call(self.expert_done) == (call.name, call.arguments):
                    self.expert_done += 1
            messages.append(tool_message(call.id, call.name, text))
        return StepResult(messages=messages, metrics={"success": 0.0})

    def text_step(self, content: str) -> StepResult | None:
        found = FINAL_ANSWER.search(content.split("Observation:")[0].replace("\\_", "_"))
        if not found:
            return None
        digits = found.group(1)
        k = int(digits) if len(digits) <= MAX_VARIABLE_DIGITS else len(self.variables)  # `#<4,301 digits>`
        if k >= len(self.variables):
            note = f"Error: #{k} is not a variable (there are {len(self.variables)})."
            return StepResult([{"role": "user", "content": note}], done=True, status=Status.INVALID_ACTION,
                              metrics={"success": 0.0, "f1": 0.0, "exact_match": 0.0})
        predicted = set(self.backend.execute(self.variables[k].program))
        exact = float(predicted == self.sample.answer)
        return StepResult([], done=True, reward=exact, status=Status.COMPLETED,
                          metrics={"success": exact, "f1": f1_score(predicted, self.sample.answer),
                                   "exact_match": exact})

    def _resolve(self, arg: str) -> Variable | str:
        """A variable "#k", or an entity id (a name of the question's entities maps to its id)."""
        arg = arg.strip().removeprefix("variable ").removeprefix("Variable ").strip()
        if arg.startswith("#"):
            if not arg[1:].isdigit() or len(arg) > MAX_VARIABLE_DIGITS + 1 or int(arg[1:]) >= len(self.variables):
                raise ValueError(f"{arg} is not a variable (there are {len(self.variables)}).")
            return self.variables[int(arg[1:])]
        if arg in self.sample.entities:
            return self.sample.entities[arg]
        if ENTITY_ID.match(arg):
            return arg
        raise ValueError(f"{arg!r} is neither a variable (#id) nor an entity of the question.")

    def _variable(self, arg: str, tool: str) -> Variable:
        v = self._resolve(arg)
        if not isinstance(v, Variable):
            raise ValueError(f"{tool} needs a variable (#id), not the entity {arg!r}.")
        return v

    def _new(self, type_: str, program: Program) -> str:
        size = program_size(program)
        if size > MAX_PROGRAM_NODES:
            raise ValueError(f"this query would make a variable of {size} operations; at most "
                             f"{MAX_PROGRAM_NODES} are allowed.")
        self.variables.append(Variable(type_, program))
        k = len(self.variables) - 1
        if type_ == NUMBER_TYPE:
            return f"Observation: variable #{k}, which is a number"
        return f"Observation: variable #{k}, which are instances of {type_}"

    def _run(self, name: str, args: dict[str, str]) -> str:
        if name in ("get_relations", "get_neighbors"):
            v = self._resolve(args["variable"])
            program = v.program if isinstance(v, Variable) else ("ENT", v)
            if name == "get_relations":
                relations = self.backend.relations(program)
                self.shown_relations[program] = set(relations)
                return f"Observation: [{', '.join(relations)}]"
            relation = args["relation"].strip()
            if relation not in self.shown_relations.get(program, ()):
                raise ValueError(f"{relation!r} is not among the relations get_relations showed for "
                                 f"{args['variable']}; call get_relations({args['variable']}) first.")
            return self._new(self.backend.range_of(relation), ("JOIN", relation, program))
        if name == "intersection":
            a, b = self._variable(args["variable1"], name), self._variable(args["variable2"], name)
            if a.type != b.type:
                raise ValueError(f"the two variables are of different types ({a.type}, {b.type}).")
            return self._new(a.type, ("AND", a.program, b.program))
        v = self._variable(args["variable"], name)
        if name == "count":
            return self._new(NUMBER_TYPE, ("COUNT", v.program))
        if name == "get_attributes":
            attributes = self.backend.attributes(v.program)
            self.shown_attributes[v.program] = set(attributes)
            return f"Observation: [{', '.join(attributes)}]"
        attribute = args["attribute"].strip()
        if attribute not in self.shown_attributes.get(v.program, ()):
            raise ValueError(f"{attribute!r} is not among the attributes get_attributes showed for "
                             f"{args['variable']}; call get_attributes({args['variable']}) first.")
        return self._new(v.type, (name.upper(), v.program, attribute))

    # ------------------------------------------------------------------------------------ expert

    def _expert_call(self, k: int) -> tuple[str, dict[str, str]] | None:
        """The k-th of the sample's actions as a tool call; an entity id of the question goes by its
        name, as the model sees it (ids work too, but a model never sees them)."""
        if k >= len(self.sample.actions):
            return None
        name, args = parse_action(self.sample.actions[k])
        return name, {key: self.names.get(a, a) for key, a in args.items()}

    def expert_message(self) -> dict[str, Any]:
        """The next of the sample's actions, then 'Final Answer: #<last variable>'. A function of the
        episode's state (asking twice gives the same message)."""
        if not self.skilled:
            return self._hasty_message()
        nxt = self._expert_call(self.expert_done)
        if nxt is not None:
            return call_message([nxt], self.expert_done)
        return text_message(f"Final Answer: #{max(len(self.variables) - 1, 0)}")

    def _hasty_message(self) -> dict[str, Any]:
        """The unskilled expert: `_hasty_plan`'s calls, then 'Final Answer: #<last variable>' in the skilled
        expert's words. A function of the episode's state, as `expert_message` is."""
        played, relation = self._hasty_plan()
        first = self._expert_call(0)
        if relation is not None and first is not None and self.expert_done >= played and not self.variables:
            hop = {"variable": first[1]["variable"], "relation": relation}
            return call_message([("get_neighbors", hop)], self.expert_done)
        nxt = self._expert_call(self.expert_done) if self.expert_done < played else None
        if nxt is not None:
            return call_message([nxt], self.expert_done)
        return text_message(f"Final Answer: #{max(len(self.variables) - 1, 0)}")

    def _hasty_plan(self) -> tuple[int, str | None]:
        """(how many of the sample's actions the unskilled expert plays, the relation it then follows from the
        question's first entity or None), worked out on a scratch episode when the expert is first asked (an
        episode the policy plays never pays for its queries).

        It stops at the first variable on the sample's way that is not the last one and not yet the answer. A
        one-hop question has no such variable, nor does a superlative over one film: there it looks up the first
        entity's relations and follows the first one that leads elsewhere than the answer, in as many actions as
        a one-hop answer takes. The answer is then well formed (a variable) and wrong, never `invalid_action`. A
        sample where both fail (no entity first, every relation leads to the answer) is played whole."""
        if self._hasty is None:
            self._hasty = self._find_hasty_plan()
        return self._hasty

    def _find_hasty_plan(self) -> tuple[int, str | None]:
        actions = self.sample.actions
        made = sum(parse_action(a)[0] not in LOOKUPS for a in actions)
        scratch = KGEpisode(self.sample, self.backend)
        for k in range(len(actions)):
            before, call = len(scratch.variables), scratch._expert_call(k)
            try:
                if call is not None:
                    scratch._run(*call)
            except ValueError:  # a sample whose own actions fail: no early stop on its way
                break
            if before < len(scratch.variables) < made and not self._is_answer(scratch.variables[-1].program):
                return k + 1, None
        first = self._expert_call(0)
        if first is not None and first[0] == "get_relations" and not first[1]["variable"].startswith("#"):
            entity = ("ENT", self.sample.entities.get(first[1]["variable"], first[1]["variable"]))
            for relation in self.backend.relations(entity):
                if not self._is_answer(("JOIN", relation, entity)):
                    return 1, relation
        return len(actions), None

    def _is_answer(self, program: Program) -> bool:
        return set(self.backend.execute(program)) == self.sample.answer
