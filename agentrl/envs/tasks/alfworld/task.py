"""`alfworld`: AgentBench-FC's ALFWorld — act in a household text game until its goal is reached.

Tool and limit are AgentBench-FC's (configs-alfworld.yaml): `take_action(action)`, at most 20 rounds.
The first user message gives the room, the goal ("Your task is to: ...") and the admissible actions
("AVAILABLE ACTIONS: ..."), as AgentBench does; each action's answer is the game's reply followed by
the actions admissible now. An action that is not admissible does nothing and is answered "Nothing
happens." (ALFWorld's reply; the game does not advance). Reward: 1.0 when the game is won, else 0.0
(a lost game ends with 0.0); status "completed"; metrics {"success": reward}. The episode ends when the
game does.

Games (TextWorld, which ALFWorld is built on; the `textworld` package is the `envs` extra):
  * `source="ours"` (default): small household games generated offline by TextWorld's generator
    (`alfworld_data.py`): `data/alfworld/games.tar.xz`, unpacked on first use into a cache folder
    (`AGENTRL_CACHE_DIR`, default `~/.cache/agentrl`); train 40 games, test 10.
  * `source="alfworld"`: ALFWorld's own games (`game.tw-pddl`, played by TextWorld's PDDL engine,
    which needs `fast-downward-textworld`: `pip install textworld[pddl]`), from the ALFWorld data folder
    (`alfworld_data` / `ALFWORLD_DATA`); `source="agentbench"` is the same. Splits are AgentBench's files
    of game paths by task type (`data/alfworld/*.json` of an AgentBench checkout, or this project's copy
    of `dev.json`): dev = dev.json, test = new_std.json (AgentBench-FC's alfworld-std), train =
    train_valid.json, standard = standard.json, each when the checkout has it.

Protocol: "strict" (ours) or "faithful" (AgentBench-FC's loop and prompt, read from the checkout;
`alfworld_faithful`), the default for AgentBench's games when a checkout is given.

The scripted expert plays the game's own walkthrough from the current state (TextWorld's
`policy_commands`), one action per turn.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import tarfile
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

from agentrl.envs.api import Action, EnvError, StepResult, tool_message
from agentrl.envs.protocol import resolve_protocol
from agentrl.envs.tasks.agentbench import Checkout
from agentrl.envs.tasks.shared import call_message, data_root, env_path, import_optional, split_index, split_indices
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
INSTALL = "pip install -e '.[envs]' (TextWorld 1.7.0)"
# AgentBench's split files (data/alfworld/ of a checkout); configs/tasks/alfworld.yaml: alfworld-std reads
# new_std, alfworld-env_train train_valid; standard.json is the older test set
AGENTBENCH_SPLITS = {"train": "train_valid.json", "test": "new_std.json", "dev": "dev.json",
                     "standard": "standard.json"}


TEXTWORLD = threading.Lock()
"""TextWorld is not thread-safe (its grammar parser, TatSu, shares state: concurrent loads fail with
"pop from empty list"), and the worker runs this blocking task in threads: every TextWorld call holds
this lock. Loading a game takes ~0.2 s and a step milliseconds, so one worker serves a few new episodes a
second; run more workers for more."""


def _textworld() -> Any:
    return import_optional("textworld", INSTALL, "alfworld")


def cache_root() -> Path:
    return Path(os.environ.get("AGENTRL_CACHE_DIR") or Path.home() / ".cache" / "agentrl")


def unpack_games(archive: Path) -> Path:
    """The folder of `archive`'s games, unpacked once into the cache (keyed by the archive's hash)."""
    if not archive.is_file():
        raise FileNotFoundError(f"alfworld: {archive} not found (make it with "
                                "`python -m agentrl.envs.tasks.alfworld_data {archive}`)")
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()[:16]
    target = cache_root() / "alfworld" / digest
    if not (target / "games" / "manifest.json").is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".unpack-"))
        with tarfile.open(archive, "r:xz") as tar:
            tar.extractall(tmp, filter="data")
        try:
            tmp.rename(target)  # atomic: a concurrent unpacker either wins or finds it done
        except OSError:
            if not (target / "games" / "manifest.json").is_file():
                raise
    return target / "games"


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
    def __init__(self, game: Path) -> None:
        tw = _textworld()
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
        messages = []
        done = False
        for call in action.tool_calls:
            if done:
                messages.append(tool_message(call.id, call.name, "Error: the game is over."))
                continue
            wanted = " ".join(call.arguments["action"].lower().split())  # case and spacing do not matter
            command = next((c for c in self.commands if " ".join(c.lower().split()) == wanted), None)
            reply, done = self.play(command)
            messages.append(tool_message(call.id, call.name, reply + ("" if done else "\n" + available(self.commands))))
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
        plan = list(self.state.policy_commands or []) or self.commands[:1]
        return call_message([("take_action", {"action": plan[0]})], self.moves)

    def close(self) -> None:
        env, self.env = getattr(self, "env", None), None
        if env is not None:
            with TEXTWORLD:
                env.close()


class AlfworldTask:
    """The `alfworld` task.

    Args:
        source: "ours" (default: this project's generated games) or "alfworld" / "agentbench" (ALFWorld's
            games, AgentBench's split files).
        alfworld_data: ALFWorld's data folder (default `ALFWORLD_DATA`), which holds `json_2.1.1/...`.
        agentbench_dir: an AgentBench checkout (default `AGENTRL_AGENTBENCH_DIR`) for its split files;
            without one, "dev" comes from this project's copy in `data/agentbench/alfworld/`.
        data_dir: this project's data folder (default `data/`).
        protocol: "faithful" or "strict" (module docstring).
    """

    name = "alfworld"
    max_turns = MAX_ROUNDS
    blocking = True  # loading a game takes a few tenths of a second

    def __init__(self, source: str = "ours", alfworld_data: str | Path | None = None,
                 agentbench_dir: str | Path | None = None, data_dir: str | Path | None = None,
                 protocol: str | None = None) -> None:
        _textworld()
        root = Path(data_dir) if data_dir else data_root()
        checkout = Checkout.find(agentbench_dir)
        self.games: dict[str, list[Path]] = {}
        if source == "agentbench":  # AgentBench's games are ALFWorld's
            source = "alfworld"
        if source == "ours":
            folder = unpack_games(root / "alfworld" / "games.tar.xz")
            manifest = json.loads((folder / "manifest.json").read_text())
            for split, n in manifest["splits"].items():
                self.games[split] = [folder / f"{split}-{i}.z8" for i in range(n)]
        elif source == "alfworld":
            base = Path(alfworld_data) if alfworld_data else env_path("ALFWORLD_DATA")
            if base is None:
                raise ValueError("alfworld: source='alfworld' needs alfworld_data or ALFWORLD_DATA (ALFWorld's data)")
            splits = checkout.path("data/alfworld") if checkout else root / "agentbench" / "alfworld"
            for split, file in AGENTBENCH_SPLITS.items():
                if (splits / file).is_file():
                    self.games[split] = load_split(splits / file, base)
            if not self.games:
                names = ", ".join(AGENTBENCH_SPLITS.values())
                raise FileNotFoundError(f"alfworld: no split files ({names}) in {splits}")
        else:
            raise ValueError(f"alfworld: unknown source {source!r} (ours | alfworld)")
        self.sizes = {split: len(g) for split, g in self.games.items()}
        self.protocol = resolve_protocol(protocol, source == "alfworld" and checkout is not None, self.name)
        self.faithful: Any = None  # alfworld_faithful.FaithfulPrompts in the faithful protocol
        if self.protocol == "faithful":
            if checkout is None:
                raise ValueError("alfworld: protocol='faithful' reads AgentBench-FC's prompt from a checkout: give "
                                 "agentbench_dir or AGENTRL_AGENTBENCH_DIR")
            from agentrl.envs.tasks.alfworld_faithful import FaithfulPrompts  # it subclasses AlfworldEpisode

            self.faithful = FaithfulPrompts.read(checkout)
            self.max_turns = self.faithful.max_rounds

    def indices(self, split: str) -> list[str]:
        return split_indices(self.name, split, self.sizes)

    def start(self, index: str) -> AlfworldEpisode:
        split, i = split_index(self.name, index, self.sizes)
        game = self.games[split][i]
        if not game.is_file():
            raise EnvError("env_error", f"alfworld: game file {game} is missing")
        if self.faithful is not None:
            from agentrl.envs.tasks.alfworld_faithful import FaithfulAlfworldEpisode

            return FaithfulAlfworldEpisode(game, self.faithful)
        return AlfworldEpisode(game)

    def tools(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.faithful.tools if self.faithful else TOOLS)


def load_split(path: Path, base: Path) -> list[Path]:
    """AgentBench's ALFWorld split file ({task type: [game path, ...]}) as game paths under `base`."""
    with path.open() as f:
        by_type = json.load(f)
    if not isinstance(by_type, dict) or not all(isinstance(v, list) for v in by_type.values()):
        raise ValueError(f"{path}: expected {{task type: [game path, ...]}} as in AgentBench's alfworld files")
    return [base / p for paths in by_type.values() for p in paths]
