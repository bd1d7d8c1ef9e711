"""`kg`: AgentBench-FC's knowledge-graph task — answer a question by querying a knowledge base.

Tools, exactly AgentBench-FC's (`src/server/tasks/knowledgegraph/const.py`): `get_relations(variable)`,
`get_neighbors(variable, relation)`, `intersection(variable1, variable2)`, `get_attributes(variable)`,
`argmax(variable, attribute)`, `argmin(variable, attribute)`, `count(variable)`; at most 15 rounds.
An argument is a variable "#k", an entity named in the question (mapped to its id), or an entity id.
Queries build *programs* (JOIN / AND / COUNT / ARGMAX / ARGMIN over entity sets, as AgentBench's
s-expressions do); each variable holds one, and a backend executes it:

  * `LocalGraph` (default): a graph that ships in `data/kg/graph.json` (made by `kg_data.py` with a
    fixed seed: films, people, countries, cities, genres in Freebase-style relation names);
  * `SparqlBackend` (`kg_sparql.py`): a SPARQL endpoint serving Freebase, AgentBench's own setup, used
    when `sparql_url` (or `AGENTRL_KG_SPARQL_URL`) is set.

The agent ends the episode as in AgentBench-FC: a message *without* a tool call that says
"Final Answer: #k". Reward (0/1): 1.0 when the answer variable's executed set equals the gold answer
set exactly, else 0.0; status "completed"; metrics {"success", "f1", "exact_match"} (AgentBench's
F1 over the two sets is kept as a metric). A "#k" that names no variable ends the episode as
"invalid_action" (AgentBench-FC: AGENT_VALIDATION_FAILED). A text reply without a final answer gets
the shared "please call one of the tools" observation. Bad arguments (unknown entity or variable, a
relation or attribute that get_relations / get_attributes did not show for that variable first — the
order AgentBench enforces —, intersecting two types) get an "Error: ..." tool message and use up the
turn.

Samples are AgentBench's format (`question`, `entities` name→id, `actions`, `answer`), so one loader
reads ours (`data/kg/{train,test}.json`, `source="ours"`) and AgentBench's (`source="agentbench"`:
`data/knowledgegraph/{kg_rl_all,std,dev}.json` of a checkout given as `agentbench_dir` /
`AGENTRL_AGENTBENCH_DIR`, or this project's copy of the dev file in `data/agentbench/`); AgentBench's
files need the SPARQL backend (their entities are Freebase ids). `protocol="faithful"` (the default
with `source="agentbench"`) runs AgentBench-FC's loop with its prompts read from the checkout
(`kg_faithful`). The scripted expert replays a
sample's `actions` one per turn (an entity id of the question called by its name, as the model sees
it), then answers with the last variable they made.
"""
from __future__ import annotations

import copy
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agentrl.envs.api import Action, EnvError, StepResult, tool_message
from agentrl.envs.protocol import resolve_protocol
from agentrl.envs.tasks.agentbench import Checkout
from agentrl.envs.tasks.shared import (
    call_message,
    data_root,
    read_json,
    split_index,
    split_indices,
    text_message,
)
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
ENTITY_ID = re.compile(r"^[a-z]\.[A-Za-z0-9_]+$")
NUMBER_TYPE = "type.int"

Program = tuple[Any, ...]
"""("ENT", id) | ("JOIN", relation, p) | ("AND", p, q) | ("COUNT", p) | ("ARGMAX"|"ARGMIN", p, attribute)."""
MAX_PROGRAM_NODES = 256
"""The most operations a variable's program may hold, counted as a tree (a variable used twice counts twice).
Variables share sub-programs, so `intersection(#k, #k)` doubles the tree: a chain of them would make
hashing the program, executing it and writing its SPARQL query exponential in the chain's length. A
real question's program is a few dozen operations at most (15 rounds); past the bound the call is
refused with an observation."""


def program_size(program: Program) -> int:
    """Operations in `program` counted as a tree, computed over the DAG (linear in distinct nodes)."""
    sizes: dict[int, int] = {}

    def size(p: Program) -> int:
        if id(p) not in sizes:
            sizes[id(p)] = 1 + sum(size(c) for c in p[1:] if isinstance(c, tuple))
        return sizes[id(p)]

    return size(program)


class KGBackend(Protocol):
    """What executes programs: the local graph or a SPARQL endpoint."""

    def execute(self, program: Program) -> list[str]:
        """Entity ids (or literal values) the program denotes, sorted."""
        ...

    def relations(self, program: Program) -> list[str]:
        ...

    def attributes(self, program: Program) -> list[str]:
        ...

    def range_of(self, relation: str) -> str:
        """The type of the entities a relation leads to."""
        ...


class LocalGraph:
    """An in-memory graph: entities with names and types, triples, numeric attributes, a schema.

    File format (`graph.json`): {"entities": {id: {"name", "type"}}, "relations": {name: {"domain",
    "range"}}, "triples": [[s, r, o], ...], "attributes": {id: {attribute: number}}}.
    """

    def __init__(self, graph: dict[str, Any]) -> None:
        self.entities: dict[str, dict[str, str]] = graph["entities"]
        self.schema: dict[str, dict[str, str]] = graph["relations"]
        self.values: dict[str, dict[str, float]] = graph.get("attributes", {})
        self.out: dict[str, dict[str, set[str]]] = {}
        for s, r, o in graph["triples"]:
            self.out.setdefault(s, {}).setdefault(r, set()).add(o)

    @classmethod
    def load(cls, path: Path) -> LocalGraph:
        return cls(read_json(path, "the kg task's local graph"))

    def _set(self, program: Program, memo: dict[int, set[str]] | None = None) -> set[str]:
        """The program's entities; each shared sub-program is evaluated once (`memo`, by identity)."""
        memo = {} if memo is None else memo
        if id(program) not in memo:
            memo[id(program)] = self._eval(program, memo)
        return memo[id(program)]

    def _eval(self, program: Program, memo: dict[int, set[str]]) -> set[str]:
        op = program[0]
        if op == "ENT":
            return {program[1]} if program[1] in self.entities else set()
        if op == "JOIN":
            return {o for s in self._set(program[2], memo) for o in self.out.get(s, {}).get(program[1], ())}
        if op == "AND":
            return self._set(program[1], memo) & self._set(program[2], memo)
        if op == "COUNT":
            return {str(len(self._set(program[1], memo)))}
        if op in ("ARGMAX", "ARGMIN"):
            scored = {e: self.values[e][program[2]] for e in self._set(program[1], memo)
                      if program[2] in self.values.get(e, {})}
            if not scored:
                return set()
            best = max(scored.values()) if op == "ARGMAX" else min(scored.values())
            return {e for e, v in scored.items() if v == best}
        raise ValueError(f"unknown program {op!r}")

    def execute(self, program: Program) -> list[str]:
        return sorted(self._set(program))

    def relations(self, program: Program) -> list[str]:
        return sorted({r for e in self._set(program) for r in self.out.get(e, {})})

    def attributes(self, program: Program) -> list[str]:
        return sorted({a for e in self._set(program) for a in self.values.get(e, {})})

    def range_of(self, relation: str) -> str:
        return self.schema.get(relation, {}).get("range", "unknown")


@dataclass(frozen=True)
class Variable:
    type: str
    program: Program


@dataclass
class KGSample:
    question: str
    entities: dict[str, str]  # name -> id
    answer: set[str]
    actions: list[str] = field(default_factory=list)
    qid: str = ""

    @classmethod
    def from_agentbench(cls, item: dict[str, Any]) -> KGSample:
        return cls(question=item["question"], entities=dict(item.get("entities") or {}),
                   answer={str(a["answer_argument"]) for a in item["answer"]},
                   actions=list(item.get("actions") or []), qid=str(item.get("qid", "")))


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
    def __init__(self, sample: KGSample, backend: KGBackend) -> None:
        self.sample = sample
        self.backend = backend
        self.variables: list[Variable] = []
        # what get_relations / get_attributes showed, per program: AgentBench refuses get_neighbors and
        # argmax/argmin with a relation or attribute not fetched first for that same variable
        self.shown_relations: dict[Program, set[str]] = {}
        self.shown_attributes: dict[Program, set[str]] = {}
        self.names = {eid: name for name, eid in sample.entities.items()}
        self.expert_done = 0  # how many of the sample's `actions` have run (the expert's place in them)

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
        k = int(found.group(1))
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
            if not arg[1:].isdigit() or int(arg[1:]) >= len(self.variables):
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
        nxt = self._expert_call(self.expert_done)
        if nxt is not None:
            return call_message([nxt], self.expert_done)
        return text_message(f"Final Answer: #{max(len(self.variables) - 1, 0)}")


DEFAULT_FILES = {"train": "kg/train.json", "test": "kg/test.json"}
# AgentBench's own paths (configs/tasks/kg.yaml: kg-env_train, kg-std)
AGENTBENCH_FILES = {"train": "data/knowledgegraph/kg_rl_all.json", "test": "data/knowledgegraph/std.json",
                    "dev": "data/knowledgegraph/dev.json"}
DEV_FILE = "knowledgegraph/dev.json"


class KGTask:
    """The `kg` task.

    Args:
        source: "ours" (default: this project's graph and questions, `data/kg/`) or "agentbench"
            (AgentBench's Freebase questions, which need `sparql_url`): train = kg_rl_all.json and
            test = std.json of the checkout, dev = dev.json (from the checkout, else this project's copy
            in `data/agentbench/knowledgegraph/`). Each split is read when first used.
        sparql_url: a SPARQL endpoint serving Freebase (default `AGENTRL_KG_SPARQL_URL`), e.g.
            AgentBench's `http://localhost:3001/sparql`.
        agentbench_dir: an AgentBench checkout (default `AGENTRL_AGENTBENCH_DIR`).
        data_dir: this project's data folder (default `data/`).
        protocol: "faithful" (AgentBench-FC's loop, prompts and one-shot example read from the checkout;
            the default with source="agentbench" and a checkout; `kg_faithful`) or "strict" (ours, the
            default otherwise).
    """

    name = "kg"
    max_turns = MAX_ROUNDS

    def __init__(self, source: str = "ours", sparql_url: str | None = None,
                 agentbench_dir: str | Path | None = None, data_dir: str | Path | None = None,
                 protocol: str | None = None) -> None:
        if source not in ("ours", "agentbench"):
            raise ValueError(f"kg: unknown source {source!r} (ours | agentbench)")
        root = Path(data_dir) if data_dir else data_root()
        checkout = Checkout.find(agentbench_dir)
        self.backend: KGBackend
        self.files: dict[str, Path] = {}
        self.from_checkout = False
        if source == "ours":
            self.backend = LocalGraph.load(root / "kg" / "graph.json")
            self.files = {split: root / file for split, file in DEFAULT_FILES.items()}
        else:
            url = sparql_url or os.environ.get("AGENTRL_KG_SPARQL_URL", "").strip()
            if not url:
                raise ValueError("kg: source='agentbench' needs a Freebase SPARQL endpoint: sparql_url or "
                                 "AGENTRL_KG_SPARQL_URL (AgentBench's questions are about Freebase ids)")
            from agentrl.envs.tasks.kg_sparql import SparqlBackend

            self.backend = SparqlBackend(url)
            if checkout is not None:
                self.files = {split: checkout.path(file) for split, file in AGENTBENCH_FILES.items()}
                self.from_checkout = True
            else:
                self.files = {"dev": root / "agentbench" / DEV_FILE}
        self.samples: dict[str, list[KGSample]] = {}
        self._lock = threading.Lock()
        # AgentBench's questions without a checkout (this project's dev copy): nothing to read prompts from
        self.protocol = resolve_protocol(protocol, source == "agentbench" and checkout is not None, self.name)
        self.faithful: Any = None  # kg_faithful.FaithfulPrompts in the faithful protocol
        if self.protocol == "faithful":
            if checkout is None:
                raise ValueError("kg: protocol='faithful' reads AgentBench-FC's prompts from a checkout: give "
                                 "agentbench_dir or AGENTRL_AGENTBENCH_DIR")
            from agentrl.envs.tasks.kg_faithful import FaithfulPrompts  # it subclasses KGEpisode

            self.faithful = FaithfulPrompts.read(checkout)
            self.max_turns = self.faithful.max_rounds

    @property
    def sizes(self) -> dict[str, int]:
        """Sizes of the splits read so far."""
        return {split: len(s) for split, s in self.samples.items()}

    def split(self, split: str) -> list[KGSample]:
        """The samples of one split, read from its file on first use."""
        if split not in self.files:
            raise EnvError("bad_request", f"kg has no split {split!r} (splits: {', '.join(self.files)})")
        with self._lock:
            if split not in self.samples:
                path = self.files[split]
                if self.from_checkout and not path.is_file():
                    raise FileNotFoundError(f"kg: split {split!r} reads {path}, which this AgentBench checkout does "
                                            f"not have (the other splits load without it)")
                self.samples[split] = load_samples(path)
            return self.samples[split]

    def tools(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.faithful.tools if self.faithful else TOOLS)

    def indices(self, split: str) -> list[str]:
        return split_indices(self.name, split, {split: len(self.split(split))})

    def start(self, index: str) -> KGEpisode:
        split = index.rpartition("-")[0]
        samples = self.split(split) if split in self.files else []
        _, i = split_index(self.name, index, {split: len(samples)})
        if self.faithful is not None:
            from agentrl.envs.tasks.kg_faithful import FaithfulKGEpisode

            return FaithfulKGEpisode(samples[i], self.backend, self.faithful, split in self.faithful.one_shot_splits)
        return KGEpisode(samples[i], self.backend)


def load_samples(path: Path) -> list[KGSample]:
    """Samples of an AgentBench-format KG file (a JSON list of questions)."""
    items = read_json(path, "kg samples")
    if not isinstance(items, list):
        raise ValueError(f"{path}: expected a JSON list of questions")
    try:
        return [KGSample.from_agentbench(item) for item in items]
    except (KeyError, TypeError) as e:
        raise ValueError(f"{path}: not in AgentBench's KG format ({type(e).__name__}: {e})") from e
