"""The `webshop` task in AgentBench-FC's protocol (`protocol="faithful"`): its loop, rewritten, over our
rendition of WebShop's pages.

What AgentBench-FC's `WebShop.sync_start_sample` does each round, and so what this episode does:
  * only the first tool call counts; its first argument's value, whatever the key, becomes
    `search[<value>]` for `search_action` and `click[<value>]` for `click_action`; a call of another
    tool does nothing, and the next round shows the last observation again as a user message
    ("Observation:\\n...\\n\\nAvailable Actions:\\n...");
  * a message without tool calls: the observation becomes "No executable tool calls found! You should
    call a tool instead.", shown the same way; a first call whose arguments cannot be read: the user
    message "No valid tool call found from agent.", then the last observation again;
  * an action is answered "Action: <action>\\n\\nObservation:\\n<page>\\n\\nAvailable Actions:\\n<...>";
  * "Buy Now" ends the episode with WebShop's reward and no further message.
The system prompt (`prompt_with_max_turn`) is read from the checkout's `src/server/tasks/webshop/task.py`,
the tools and the round limit from `configs/tasks/webshop.yaml`.
"""
from __future__ import annotations

from typing import Any

from agentrl.tasks.agentbench import AgentBenchPrompts, Checkout, PromptSource
from agentrl.tasks.api import Action, StepResult, tool_message
from agentrl.tasks.protocol import CallPolicy, first_value
from agentrl.tasks.webshop.catalog import Catalog, Goal
from agentrl.tasks.webshop.episode import WebShopEpisode
from agentrl.types import Status

TASK_FILE = "src/server/tasks/webshop/task.py"
CONFIG = "configs/tasks/webshop.yaml"
SECTIONS = {"test": "webshop-std", "train": "webshop-env_train"}
NO_CALLS = "No executable tool calls found! You should call a tool instead."
BAD_CALL = "No valid tool call found from agent."
ACTIONS = {"search_action": "search", "click_action": "click"}


PROMPTS = PromptSource(config=CONFIG, section=SECTIONS["test"], rounds_key="round", default_rounds=20,
                       prompt_file=TASK_FILE, prompt="prompt_with_max_turn")
"""Where the WebShop server keeps its prompt (`prompt_with_max_turn`), tools and round limit."""


def goal_ranges(checkout: Checkout) -> dict[str, tuple[int, int]]:
    """The goals each split plays (`start`, `end` of its config section), in WebShop's goal order."""
    sections = {split: checkout.task_config(CONFIG, name) for split, name in SECTIONS.items()}
    return {split: (int(c.get("start", 0)), int(c.get("end", 500))) for split, c in sections.items()}


class FaithfulWebShopEpisode(WebShopEpisode):
    call_policy = CallPolicy(first_call_only=True, lenient_arguments=True)

    def __init__(self, catalog: Catalog, goal: Goal, prompts: AgentBenchPrompts, skilled: bool = True) -> None:
        super().__init__(catalog, goal, skilled)
        self.prompts = prompts
        self.last = self.observation()  # AgentBench's `observation`: shown again when an action does nothing

    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": self.prompts.system}, super().initial_messages()[1]]

    def _again(self) -> dict[str, Any]:
        return {"role": "user", "content": f"Observation:\n{self.last}\n\nAvailable Actions:\n{self.available()}"}

    def text_step(self, content: str) -> StepResult:
        self.last = NO_CALLS
        return StepResult([self._again()], metrics={"score": 0.0, "success": 0.0})

    def step(self, action: Action) -> StepResult:
        call = action.tool_calls[0]
        self.moves += 1
        bad = StepResult([{"role": "user", "content": BAD_CALL}, self._again()], metrics={"score": 0.0, "success": 0.0})
        if call.error is not None or not isinstance(call.arguments, dict):  # AgentBench: json.loads, .values()
            return bad
        if call.name not in ACTIONS:  # read before the arguments' first value: another tool does nothing
            return StepResult([self._again()], metrics={"score": 0.0, "success": 0.0})
        try:
            value = first_value(call.arguments)
        except ValueError:
            return bad
        text = f"{ACTIONS[call.name]}[{value}]"
        self.last = self._act(call.name, str(value).strip()) or self.observation()
        if self.page.kind == "done":
            score, info = self._score
            metrics = {"score": score, "success": float(score == 1.0), **{f"r_{k}": v for k, v in info.items()}}
            return StepResult([], done=True, reward=score, status=Status.COMPLETED, metrics=metrics)
        content = f"Action: {text}\n\nObservation:\n{self.last}\n\nAvailable Actions:\n{self.available()}"
        return StepResult([tool_message(call.id, call.name, content)], metrics={"score": 0.0, "success": 0.0})
