"""One `db` episode in this project's protocol ("strict"): SQL statements, then a committed answer.

An episode asks its task (`Databases`) for a fresh database of its sample's tables and for the table
hash the gold SQL leaves; it never sees the task class, so this module does not import it.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, Protocol

from agentrl.tasks.api import Action, StepResult, tool_message
from agentrl.tasks.db.backends import MariaDBDatabase, SqliteDatabase, Table
from agentrl.tasks.db.grading import MODIFY, answers_match
from agentrl.tasks.db.samples import DbSample
from agentrl.tasks.shared import call_message
from agentrl.types import Status

MAX_ROUNDS = 15

# AgentBench-FC's tool schemas (configs/tasks/dbbench.yaml), unchanged.
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "execute_sql",
        "description": "Executes a given SQL statement on the database and returns the result.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "The SQL query to be executed."}},
            "required": ["query"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "commit_final_answer",
        "description": "Commits the final answer after all operations are completed.",
        "parameters": {"type": "object", "properties": {
            "answers": {"type": "array", "items": {"type": "string"},
                        "description": "The list of final answers to commit."}},
            "required": ["answers"], "additionalProperties": False}}},
]

SYSTEM_PROMPT = (
    "You will answer a question about a MySQL database, or change the database as asked, by running SQL. "
    "Call execute_sql with one SQL statement at a time; you get the raw result back (a list of row tuples, or "
    "an error). When you are done, call commit_final_answer with the list of answer values; if the task was to "
    "change the database, the answers can be anything. Answer exactly: the answer values must match the correct "
    "ones. Always use the tools; an answer written in the message text does not count.")


class Databases(Protocol):
    """What an episode needs of its task (`DbTask`): databases on the configured backend."""

    def open_database(self, tables: list[Table], sqlite_file: Path | None = None) -> SqliteDatabase | MariaDBDatabase:
        """A new database holding `tables` (or the SQLite file), for one session."""
        ...

    def reference_hash(self, sample: DbSample) -> str:
        """The table hash the gold SQL leaves on a fresh database."""
        ...


GUESSES: tuple[list[str], ...] = ([], ["0"], ["unknown"])
"""The unskilled expert's answers to a question it has not queried, tried in order until one is wrong."""


class DbEpisode:
    def __init__(self, sample: DbSample, task: Databases, skilled: bool = True) -> None:
        self.sample = sample
        self.task = task
        self.skilled = skilled  # False: the expert commits before it has run any SQL (`shared.expert_skilled`)
        self.db = task.open_database(sample.tables, sample.sqlite_file)
        self.steps = 0  # steps taken so far: the expert's call ids
        self.ran_gold = False  # whether the gold SQL has been run (drives the expert)

    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": self.sample.prompt()}]

    def step(self, action: Action) -> StepResult:
        self.steps += 1
        messages: list[dict[str, Any]] = []
        for call in action.tool_calls:
            if call.name == "execute_sql":
                self.ran_gold = self.ran_gold or call.arguments["query"] == self.sample.gold_sql
                result = self.db.execute(call.arguments["query"])
                messages.append(tool_message(call.id, call.name, result or "No response from database."))
                continue
            reward = 1.0 if self.judge(call.arguments["answers"]) else 0.0
            messages.append(tool_message(call.id, call.name, "Your answer has been committed."))
            return StepResult(messages=messages, done=True, reward=reward, status=Status.COMPLETED,
                              metrics={"success": reward})
        return StepResult(messages=messages, metrics={"success": 0.0})

    def judge(self, answers: list[str]) -> bool:
        s = self.sample
        if s.kind in MODIFY:
            truth = s.answer_md5 or self.task.reference_hash(s)
            return answers_match(self.db.table_hash(s.tables), truth, s.kind)
        return answers_match(answers, s.label, s.kind, no_extra=True)

    def expert_message(self) -> dict[str, Any]:
        # A function of the episode's state, not of how often it is asked: asking twice gives one move.
        turn, s = self.steps, self.sample
        if not self.skilled:
            return call_message([("commit_final_answer", {"answers": self.guess()})], turn)
        if s.gold_sql and not self.ran_gold:
            return call_message([("execute_sql", {"query": s.gold_sql})], turn)
        if s.kind in MODIFY:
            answers: list[str] = []
        elif s.ours:
            answers = [str(x) for x in s.label or []]
        else:
            answers = self._first_column()
        return call_message([("commit_final_answer", {"answers": answers})], turn)

    def guess(self) -> list[str]:
        """The unskilled expert's commit: nothing for a change (the table is left as it was), a wrong answer
        for a question. A guess the label would accept is skipped, so the mistake always costs the reward."""
        s = self.sample
        if s.kind in MODIFY:
            return []
        for answers in GUESSES:
            try:
                if not answers_match(answers, s.label, s.kind):
                    return list(answers)
            except Exception:  # a label grading cannot read: the faithful grader fails every answer
                return list(answers)
        raise ValueError(f"db: every guess of the unskilled expert matches the label {s.label!r}")

    def _first_column(self) -> list[str]:
        # The gold query's result, run again on a fresh copy so the agent's statements cannot change it.
        if not self.sample.gold_sql:
            return []
        db = self.task.open_database(self.sample.tables, self.sample.sqlite_file)
        try:
            text = db.execute(self.sample.gold_sql)
        finally:
            db.close()
        try:
            rows = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return []  # an error, or a result that did not fit in the observation
        return [str(row[0]) for row in rows if isinstance(row, tuple) and row] if isinstance(rows, list) else []

    def close(self) -> None:
        self.db.close()
