"""The `kg` task (AgentBench-FC's knowledge graph): `agentrl.tasks.kg:KGTask`, described in `task`.

Modules, each importing only those after it (a test checks there is no cycle):
  task      `KGTask`: splits, backend, protocol
  faithful  the episode in AgentBench-FC's protocol, and the prompts it reads from a checkout
  episode   the episode in this project's protocol, the tool schemas
  samples   questions in AgentBench's KG format
  graph     the in-memory graph (default backend)
  sparql    a Freebase SPARQL endpoint (AgentBench's backend)
  program   what a variable holds, and the backend protocol both execute it through
  data      this project's graph and questions (`python -m jobs.make_task_data kg`)
"""
from agentrl.tasks.kg.episode import TOOLS, KGEpisode, f1_score, parse_action
from agentrl.tasks.kg.graph import LocalGraph
from agentrl.tasks.kg.program import MAX_PROGRAM_NODES, KGBackend, Program, program_size
from agentrl.tasks.kg.samples import KGSample, load_samples
from agentrl.tasks.kg.task import AGENTBENCH_FILES, KGTask

__all__ = ["AGENTBENCH_FILES", "MAX_PROGRAM_NODES", "TOOLS", "KGBackend", "KGEpisode", "KGSample", "KGTask",
           "LocalGraph", "Program", "f1_score", "load_samples", "parse_action", "program_size"]
