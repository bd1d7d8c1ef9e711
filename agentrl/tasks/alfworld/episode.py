"""One `alfworld` episode in this project's protocol ("strict"): one game, `take_action` until it ends."""
from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

from agentrl.tasks.alfworld.games import TEXTWORLD, textworld
from agentrl.tasks.api import Action, StepResult, tool_message
from agentrl.tasks.shared import call_message, text_message
from agentrl.types import Status

MAX_ROUNDS = 20
TOOLS: list[dict[str, Any]] = [{  # configs-alfworld.yaml of AgentBench-FC, unchanged
    "type": "function", "function": {
        "name": "take_action", "description": "Take an action.",
        "parameters": {"type": "object", "properties": {
            "action": {"type": "string", "description": "The action you would like to take"}},
            "required": ["action"], "additionalProperties": False}}}]
SYSTEM_PROMPT = """You are an agent in a household: act to complete the task you are given.
At the start you get a description of the room and your goal. Each turn you call take_action with one
of the available actions; the environment answers with what happened and the actions available next.
Only the listed actions are valid: any other action does nothing, and the environment then replies
"Nothing happens.". Act directly and try to finish in as few actions as you can."""


ONE_CALL = "Error: only the first tool call of a message is executed; this one was not."
HASTY_DONE = "I have completed the task."
"""What the unskilled expert says after its one move: it holds the task done (`AlfworldEpisode._hasty_message`)."""
NOISE = re.compile(r"Your score has just gone up|\*\*\* The End \*\*\*|You scored \d+ out of|Would you like to RESTART")


def clean(feedback: str) -> str:
    """A game's reply without TextWorld's banner, prompt line, status bar and score messages."""
    lines = []
    for line in feedback.splitlines():
        if line.lstrip().startswith(">"):
            break  # the prompt, then the status bar
        if NOISE.search(line):
            continue
        lines.append(line.rstrip())
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def available(commands: list[str]) -> str:
    return " AVAILABLE ACTIONS: " + "\n".join(commands) + "\n"


class AlfworldEpisode:
    def __init__(self, game: Path, skilled: bool = True) -> None:
        self.skilled = skilled  # False: the expert's first move is the walkthrough's last (`_hasty_message`)
        tw = textworld()
        infos = tw.EnvInfos(admissible_commands=True, won=True, lost=True, policy_commands=True, objective=True,
                            description=True)
        with TEXTWORLD, warnings.catch_warnings():  # Jericho warns "not fully supported": TextWorld keeps score
            warnings.simplefilter("ignore")
            self.env = tw.start(str(game), request_infos=infos)
            self.state = self.env.reset()
        self.moves = 0

    def initial_messages(self) -> list[dict[str, Any]]:
        intro = clean(self.state.description or "")
        goal = (self.state.objective or "").strip()
        text = f"Here is your task. {intro}\n\nYour task is to: {goal}\n{available(self.commands)}"
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]

    @property
    def commands(self) -> list[str]:
        return list(self.state.admissible_commands or [])

    def step(self, action: Action) -> StepResult:
        """One move per message, the first call's (AgentBench-FC's rule): the other calls are answered with
        a note and not played. A policy that sent 16 moves a message once won 0.30 of the games blind,
        against 0.07-0.09 with one."""
        call, rest = action.tool_calls[0], action.tool_calls[1:]
        wanted = " ".join(call.arguments["action"].lower().split())  # case and spacing do not matter
        command = next((c for c in self.commands if " ".join(c.lower().split()) == wanted), None)
        reply, done = self.play(command)
        messages = [tool_message(call.id, call.name, reply + ("" if done else "\n" + available(self.commands)))]
        messages += [tool_message(c.id, c.name, ONE_CALL) for c in rest]
        won = bool(self.state.won)
        if done or won or self.state.lost:
            self.close()
            return StepResult(messages, done=True, reward=float(won), status=Status.COMPLETED,
                              metrics={"success": float(won)})
        return StepResult(messages, metrics={"success": 0.0})

    def play(self, command: str | None) -> tuple[str, bool]:
        """One move: the game's reply to an admissible `command` (None: not one) and whether it ended."""
        self.moves += 1
        if command is None or command not in self.commands:
            return "Nothing happens.", False
        with TEXTWORLD:
            self.state, _, done = self.env.step(command)
        return clean(self.state.feedback or "") or "Nothing happens.", bool(done)

    def expert_message(self) -> dict[str, Any]:
        """The first action of the game's walkthrough from where the game now is."""
        walkthrough = list(self.state.policy_commands or []) or self.commands[:1]
        if not self.skilled:
            return self._hasty_message(walkthrough)
        return call_message([("take_action", {"action": walkthrough[0]})], self.moves)

    def _hasty_message(self, walkthrough: list[str]) -> dict[str, Any]:
        """The unskilled expert: as its first move, the walkthrough's last action (put the object in place,
        unlock the chest, ...) before any of the steps that lead to it, then a claim that the task is done.

        Before those steps the action is not yet admissible in any of our games ("Nothing happens."; AgentBench-FC's
        protocol plays the closest admissible one instead), and the game is not won. Neither our games nor
        ALFWorld's can be lost or given up, and the claim calls no tool, so the episode runs to the round limit
        (turn_limit, reward 0): the claim's answer is a line, where an idle move's would list the admissible
        actions every turn. A walkthrough of one step has no step to skip: the claim comes without the move."""
        if self.moves == 0 and len(walkthrough) > 1:
            return call_message([("take_action", {"action": walkthrough[-1]})], self.moves)
        return text_message(HASTY_DONE)

    def close(self) -> None:
        env, self.env = getattr(self, "env", None), None
        if env is not None:
            with TEXTWORLD:
                env.close()
