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
    (`data.py`): `data/alfworld/games.tar.xz`, unpacked on first use into a cache folder
    (`AGENTRL_CACHE_DIR`, default `~/.cache/agentrl`); train 40 games, test 10.
  * `source="alfworld"`: ALFWorld's own games (`game.tw-pddl`, played by TextWorld's PDDL engine,
    which needs `fast-downward-textworld`: `pip install textworld[pddl]`), from the ALFWorld data folder
    (`alfworld_data` / `ALFWORLD_DATA`); `source="agentbench"` is the same. Splits are AgentBench's files
    of game paths by task type (`data/alfworld/*.json` of an AgentBench checkout, or this project's copy
    of `dev.json`): dev = dev.json, test = new_std.json (AgentBench-FC's alfworld-std), train =
    train_valid.json, standard = standard.json, each when the checkout has it.

Protocol: "strict" (ours) or "faithful" (AgentBench-FC's loop and prompt, read from the checkout;
`faithful`), the default for AgentBench's games when a checkout is given.

The scripted expert plays the game's own walkthrough from the current state (TextWorld's
`policy_commands`), one action per turn. With `expert_skill` below 1, on a fixed share (1 - skill) of
games (`shared.expert_skilled`) it plays the walkthrough's last action first, before the steps that lead
to it, and then holds the task done: the game is not won and the episode ends at the round limit
(turn_limit, reward 0; `AlfworldEpisode._hasty_message`).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from agentrl.tasks.agentbench import AgentBenchPrompts, Checkout
from agentrl.tasks.alfworld.episode import MAX_ROUNDS, TOOLS, AlfworldEpisode
from agentrl.tasks.alfworld.faithful import PROMPTS, FaithfulAlfworldEpisode
from agentrl.tasks.alfworld.games import load_split, textworld, unpack_games
from agentrl.tasks.api import EnvError
from agentrl.tasks.options import AlfworldOptions
from agentrl.tasks.protocol import resolve_protocol
from agentrl.tasks.shared import checked_skill, data_root, env_path, expert_skilled, split_index, split_indices

# AgentBench's split files (data/alfworld/ of a checkout); configs/tasks/alfworld.yaml: alfworld-std reads
# new_std, alfworld-env_train train_valid; standard.json is the older test set
AGENTBENCH_SPLITS = {"train": "train_valid.json", "test": "new_std.json", "dev": "dev.json",
                     "standard": "standard.json"}


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
    Options = AlfworldOptions  # what `envs.task_options.alfworld` may hold, checked at load
    max_turns = MAX_ROUNDS
    blocking = True  # loading a game takes a few tenths of a second

    def __init__(self, source: str = "ours", alfworld_data: str | Path | None = None,
                 agentbench_dir: str | Path | None = None, data_dir: str | Path | None = None,
                 protocol: str | None = None, expert_skill: float = 1.0) -> None:
        self.expert_skill = checked_skill("alfworld", expert_skill)
        textworld()
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
        self.faithful: AgentBenchPrompts | None = None  # read from the checkout in the faithful protocol
        if self.protocol == "faithful":
            if checkout is None:
                raise ValueError("alfworld: protocol='faithful' reads AgentBench-FC's prompt from a checkout: give "
                                 "agentbench_dir or AGENTRL_AGENTBENCH_DIR")
            self.faithful = AgentBenchPrompts.read(checkout, PROMPTS)
            self.max_turns = self.faithful.max_rounds

    def indices(self, split: str) -> list[str]:
        return split_indices(self.name, split, self.sizes)

    def start(self, index: str) -> AlfworldEpisode:
        split, i = split_index(self.name, index, self.sizes)
        game = self.games[split][i]
        if not game.is_file():
            raise EnvError("env_error", f"alfworld: game file {game} is missing")
        skilled = expert_skilled(self.name, index, self.expert_skill)
        if self.faithful is not None:
            return FaithfulAlfworldEpisode(game, self.faithful, skilled)
        return AlfworldEpisode(game, skilled)

    def tools(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.faithful.tools if self.faithful else TOOLS)
