"""The `db` task in AgentBench-FC's protocol (`protocol="faithful"`): its loop, rewritten, over our
databases and grader.

What AgentBench-FC's `DBBenchTask.start_sample` does each round, and so what this episode does:
  * every tool call of the message runs, in order (not only the first); arguments are only
    `json.loads`-ed: one that does not parse is answered "Error: Failed to parse tool call. Tool call
    format is incorrect."; a call of another tool "Invalid function call. Please call a tool instead.";
  * `execute_sql` runs the first argument's value whatever its key (`list(arguments.values())[0]`);
    an empty result reads "No response from database.";
  * `commit_final_answer` grades the first argument's value, whatever its type (a string, a list), and
    ends the episode at once: later calls of the message do not run and the commit gets no answer;
    a commit without arguments is AgentBench's TASK_ERROR (reward 0; here status invalid_action);
  * a message without tool calls gets the user message "Internal error: No tool calls found despite
    finish reason." and the round is used up.
The system prompt and the tool descriptions are the checkout's (`task.py`'s SYSTEM_PROMPT,
`configs/tasks/dbbench.yaml`), read at start; the user prompt is built as AgentBench builds it.
"""
from __future__ import annotations

from typing import Any

from agentrl.tasks.agentbench import AgentBenchPrompts, PromptSource
from agentrl.tasks.api import Action, EnvError, StepResult, tool_message
from agentrl.tasks.db.episode import Databases, DbEpisode
from agentrl.tasks.db.grading import MODIFY, answers_match
from agentrl.tasks.db.samples import DbSample
from agentrl.tasks.protocol import CallPolicy, first_value
from agentrl.types import Status

PARSE_ERROR = "Error: Failed to parse tool call. Tool call format is incorrect."
NO_CALLS = "Internal error: No tool calls found despite finish reason."
UNKNOWN_TOOL = "Invalid function call. Please call a tool instead."


PROMPTS = PromptSource(config="configs/tasks/dbbench.yaml", section="dbbench-std", rounds_key="max_round",
                       default_rounds=15, prompt_file="src/server/tasks/dbbench/task.py", prompt="SYSTEM_PROMPT")
"""Where the dbbench server keeps its prompt (`task.py`'s SYSTEM_PROMPT), tools and round limit."""


class FaithfulDbEpisode(DbEpisode):
    call_policy = CallPolicy(first_call_only=False, lenient_arguments=True)

    def __init__(self, sample: DbSample, task: Databases, prompts: AgentBenchPrompts, skilled: bool = True) -> None:
        super().__init__(sample, task, skilled)
        self.prompts = prompts

    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": self.prompts.system},
                {"role": "user", "content": self.sample.prompt()}]

    def text_step(self, content: str) -> StepResult:
        return StepResult([{"role": "user", "content": NO_CALLS}], metrics={"success": 0.0})

    def step(self, action: Action) -> StepResult:
        self.steps += 1
        messages: list[dict[str, Any]] = []
        for call in action.tool_calls:
            if call.error is not None:
                messages.append(tool_message(call.id, call.name, PARSE_ERROR))
            elif call.name == "execute_sql":
                messages.append(tool_message(call.id, call.name, self._execute(call.arguments)))
            elif call.name == "commit_final_answer":
                try:
                    answer = first_value(call.arguments)
                except ValueError:  # AgentBench: IndexError out of the loop, TASK_ERROR, reward 0
                    return StepResult(messages, done=True, status=Status.INVALID_ACTION, metrics={"success": 0.0})
                reward = 1.0 if self._judge(answer) else 0.0
                return StepResult(messages, done=True, reward=reward, status=Status.COMPLETED,
                                  metrics={"success": reward})
            else:
                messages.append(tool_message(call.id, call.name, UNKNOWN_TOOL))
        return StepResult(messages, metrics={"success": 0.0})

    def _execute(self, arguments: Any) -> str:
        try:
            sql = first_value(arguments)
        except ValueError as e:
            return f"Error executing query: {e}"
        if not isinstance(sql, str):
            return f"Error executing query: the statement is a {type(sql).__name__}, not a string"
        self.ran_gold = self.ran_gold or sql == self.sample.gold_sql
        return self.db.execute(sql) or "No response from database."

    def _judge(self, answer: Any) -> bool:
        """AgentBench's `compare_results`, which answers False on any error."""
        s = self.sample
        try:
            if s.kind in MODIFY:
                return answers_match(self.db.table_hash(s.tables), s.answer_md5 or self.task.reference_hash(s), s.kind)
            return answers_match(answer, s.label, s.kind)
        except EnvError:
            raise  # the infrastructure's failure (a database that cannot be made), not a wrong answer
        except Exception:
            return False
