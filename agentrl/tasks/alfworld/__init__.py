"""The `alfworld` task (AgentBench-FC's ALFWorld): `agentrl.tasks.alfworld:AlfworldTask`, described
in `task`.

Modules, each importing only those after it (a test checks there is no cycle):
  task      `AlfworldTask`: games per split, protocol
  faithful  the episode in AgentBench-FC's protocol (its BLEU action snapping), where its prompt lives
  episode   the episode in this project's protocol, the tool schema, the game text's clean-up
  games     TextWorld under one lock, the game archive's cache, AgentBench's split files
  data      this project's games (`python -m agentrl.tasks.alfworld.data <archive>`)
"""
from agentrl.tasks.alfworld.episode import TOOLS, AlfworldEpisode, available, clean
from agentrl.tasks.alfworld.games import load_split, unpack_games
from agentrl.tasks.alfworld.task import AGENTBENCH_SPLITS, AlfworldTask

__all__ = ["AGENTBENCH_SPLITS", "TOOLS", "AlfworldEpisode", "AlfworldTask", "available", "clean", "load_split",
           "unpack_games"]
