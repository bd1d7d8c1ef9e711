"""`kg`: AgentBench-FC's knowledge-graph task — answer a question by querying a knowledge base.

Tools, exactly AgentBench-FC's (`src/server/tasks/knowledgegraph/const.py`): `get_relations(variable)`,
`get_neighbors(variable, relation)`, `intersection(variable1, variable2)`, `get_attributes(variable)`,
`argmax(variable, attribute)`, `argmin(variable, attribute)`, `count(variable)`; at most 15 rounds.
An argument is a variable "#k", an entity named in the question (mapped to its id), or an entity id.
Queries build *programs* (JOIN / AND / COUNT / ARGMAX / ARGMIN over entity sets, as AgentBench's
s-expressions do); each variable holds one, and a backend executes it:

  * `LocalGraph` (default): a graph that ships in `data/kg/graph.json` (made by `data.py` with a
    fixed seed: films, people, countries, cities, genres in Freebase-style relation names);
  * `SparqlBackend` (`sparql.py`): a SPARQL endpoint serving Freebase, AgentBench's own setup, used
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
(`faithful`). The scripted expert replays a
sample's `actions` one per turn (an entity id of the question called by its name, as the model sees
it), then answers with the last variable they made. With `expert_skill` below 1, on a fixed share
(1 - skill) of samples (`shared.expert_skilled`) it answers early instead: with the first variable on
the way that is not yet the answer, or, where the sample has none (one hop), with the first other
relation of the question's entity; well formed, graded 0 (`KGEpisode._hasty_plan`).
"""
from __future__ import annotations

import copy
import os
import threading
from pathlib import Path
from typing import Any

from agentrl.tasks.agentbench import Checkout
from agentrl.tasks.api import EnvError
from agentrl.tasks.kg.episode import MAX_ROUNDS, TOOLS, KGEpisode
from agentrl.tasks.kg.faithful import FaithfulKGEpisode, KGPrompts
from agentrl.tasks.kg.graph import LocalGraph
from agentrl.tasks.kg.program import KGBackend
from agentrl.tasks.kg.samples import KGSample, load_samples
from agentrl.tasks.kg.sparql import SparqlBackend
from agentrl.tasks.options import KgOptions
from agentrl.tasks.protocol import resolve_protocol
from agentrl.tasks.shared import checked_skill, data_root, expert_skilled, split_index, split_indices

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
            the default with source="agentbench" and a checkout; `faithful`) or "strict" (ours, the
            default otherwise).
    """

    name = "kg"
    Options = KgOptions  # what `envs.task_options.kg` may hold, checked at load
    max_turns = MAX_ROUNDS

    def __init__(self, source: str = "ours", sparql_url: str | None = None,
                 agentbench_dir: str | Path | None = None, data_dir: str | Path | None = None,
                 protocol: str | None = None, expert_skill: float = 1.0) -> None:
        self.expert_skill = checked_skill("kg", expert_skill)
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
        self.faithful: KGPrompts | None = None  # read from the checkout in the faithful protocol
        if self.protocol == "faithful":
            if checkout is None:
                raise ValueError("kg: protocol='faithful' reads AgentBench-FC's prompts from a checkout: give "
                                 "agentbench_dir or AGENTRL_AGENTBENCH_DIR")
            self.faithful = KGPrompts.read(checkout)
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
        skilled = expert_skilled(self.name, index, self.expert_skill)
        if self.faithful is not None:
            return FaithfulKGEpisode(samples[i], self.backend, self.faithful, split in self.faithful.one_shot_splits,
                                     skilled)
        return KGEpisode(samples[i], self.backend, skilled)

