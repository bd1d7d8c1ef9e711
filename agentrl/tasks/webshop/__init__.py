"""The `webshop` task (AgentBench-FC's WebShop): `agentrl.tasks.webshop:WebShopTask`, described in
`task`.

Modules, each importing only those after it (a test checks there is no cycle):
  task      `WebShopTask`: catalog, goal ranges per split, protocol
  faithful  the episode in AgentBench-FC's protocol, where its prompt and goal ranges live in a checkout
  episode   the episode in this project's protocol (WebShop's pages), the tool schemas, the expert
  reward    WebShop's reward for a purchase (pure functions)
  catalog   products and goals in WebShop's file formats, BM25 search
  data      this project's catalog (`python -m jobs.make_task_data webshop`)
"""
from agentrl.tasks.webshop.catalog import Catalog, Goal, Product, load_catalog, tokens
from agentrl.tasks.webshop.episode import TOOLS, WebShopEpisode
from agentrl.tasks.webshop.reward import reward, token_set_ratio, type_reward
from agentrl.tasks.webshop.task import WebShopTask

__all__ = ["TOOLS", "Catalog", "Goal", "Product", "WebShopEpisode", "WebShopTask", "load_catalog", "reward",
           "token_set_ratio", "tokens", "type_reward"]
