"""The `alfworld` task's offline games: small household text games made by TextWorld, fixed seeds.

ALFWorld's games are TextWorld games (in TextWorld's PDDL format); these are TextWorld's own
generator's: a few rooms of a house, furniture and containers, and a quest of 2-5 steps to take an
object somewhere, open something, put something on or in something. `make_archive(path)` runs
`tw-make custom` once per game (one process at a time; about 4 s each) with options and a seed drawn
from `random.Random("alfworld:<split>:<i>")`, keeps a game only if its walkthrough fits well inside
the 20-round limit, and packs each game's story file (`.z8`) and its TextWorld metadata (`.json`)
into one `games.tar.xz` (about 1.3 MB for 50 games: the story files share most of their bytes, so
the archive is solid). The task unpacks it into a cache folder on first use.

Regenerating gives the same games (the same seeds, so the same worlds and quests), though not the
same bytes: Inform 7 stamps each story file with its compile date.
"""
from __future__ import annotations

import io
import json
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SPLIT_SIZES = {"train": 40, "test": 10}
MAX_WALKTHROUGH = 12
"""A game whose walkthrough is longer is drawn again: the expert must win well inside 20 rounds."""


def game_options(split: str, i: int, attempt: int) -> list[str]:
    """`tw-make custom` options of game i of a split (the attempt-th draw)."""
    rng = random.Random(f"alfworld:{split}:{i}:{attempt}")
    return ["--world-size", str(rng.randint(2, 5)), "--nb-objects", str(rng.randint(5, 12)),
            "--quest-length", str(rng.randint(2, 5)), "--seed", str(rng.randrange(1, 10**6))]


def _tw_make() -> str:
    beside = Path(sys.executable).parent / "tw-make"
    found = str(beside) if beside.exists() else shutil.which("tw-make")
    if not found:
        raise FileNotFoundError("tw-make not found: install the envs extra (pip install -e '.[envs]')")
    return found


def make_game(split: str, i: int, workdir: Path) -> tuple[Path, Path]:
    """Generate game i of a split under `workdir`; returns its (.z8, .json) paths."""
    for attempt in range(20):
        out = workdir / f"{split}-{i}.z8"
        subprocess.run([_tw_make(), "custom", *game_options(split, i, attempt), "--output", str(out), "-f",
                        "--silent"], check=True, stdout=subprocess.DEVNULL, timeout=300)
        meta = out.with_suffix(".json")
        walkthrough = [c for q in json.loads(meta.read_text()).get("quests") or [] for c in q.get("commands") or []]
        if 0 < len(walkthrough) <= MAX_WALKTHROUGH:
            return out, meta
    raise RuntimeError(f"no game {split}-{i} with a walkthrough of at most {MAX_WALKTHROUGH} steps in 20 draws")


def make_archive(path: Path, sizes: dict[str, int] | None = None) -> dict[str, int]:
    """Generate every game and write the archive at `path`; returns {split: games}."""
    sizes = sizes or SPLIT_SIZES
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        files = []
        for split, n in sizes.items():
            for i in range(n):
                files += make_game(split, i, work)
                print(f"made {split}-{i}", flush=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        manifest = json.dumps({"splits": sizes}, sort_keys=True).encode()
        with tarfile.open(path, "w:xz", preset=9) as tar:
            for f in [*files]:
                info = tar.gettarinfo(str(f), arcname=f"games/{f.name}")
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                with f.open("rb") as fh:
                    tar.addfile(info, fh)
            info = tarfile.TarInfo("games/manifest.json")
            info.size = len(manifest)
            tar.addfile(info, io.BytesIO(manifest))
    return dict(sizes)


if __name__ == "__main__":  # python -m agentrl.tasks.alfworld.data data/alfworld/games.tar.xz
    print(make_archive(Path(sys.argv[1] if len(sys.argv) > 1 else "data/alfworld/games.tar.xz")))
