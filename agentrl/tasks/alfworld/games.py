"""The `alfworld` task's games: TextWorld (imported on first use, under one lock), this project's game
archive unpacked into a cache, and AgentBench's split files of ALFWorld game paths."""
from __future__ import annotations

import hashlib
import json
import os
import tarfile
import tempfile
import threading
from pathlib import Path
from typing import Any

from agentrl.tasks.shared import import_optional

INSTALL = "pip install -e '.[envs]' (TextWorld 1.7.0)"


TEXTWORLD = threading.Lock()
"""TextWorld is not thread-safe (its grammar parser, TatSu, shares state: concurrent loads fail with
"pop from empty list"), and the worker runs this blocking task in threads: every TextWorld call holds
this lock. Loading a game takes ~0.2 s and a step milliseconds, so one worker serves a few new episodes a
second; run more workers for more."""


def textworld() -> Any:
    """The `textworld` module, or an ImportError saying how to install it."""
    return import_optional("textworld", INSTALL, "alfworld")


def cache_root() -> Path:
    return Path(os.environ.get("AGENTRL_CACHE_DIR") or Path.home() / ".cache" / "agentrl")


def unpack_games(archive: Path) -> Path:
    """The folder of `archive`'s games, unpacked once into the cache (keyed by the archive's hash)."""
    if not archive.is_file():
        raise FileNotFoundError(f"alfworld: {archive} not found (make it with "
                                f"`python -m agentrl.tasks.alfworld.data {archive}`)")
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


def load_split(path: Path, base: Path) -> list[Path]:
    """AgentBench's ALFWorld split file ({task type: [game path, ...]}) as game paths under `base`."""
    with path.open() as f:
        by_type = json.load(f)
    if not isinstance(by_type, dict) or not all(isinstance(v, list) for v in by_type.values()):
        raise ValueError(f"{path}: expected {{task type: [game path, ...]}} as in AgentBench's alfworld files")
    return [base / p for paths in by_type.values() for p in paths]

