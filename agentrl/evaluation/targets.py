"""What an evaluation scores: a run's weights, a model directory, or an OpenAI-compatible endpoint.

    runs/demo            a run dir: its newest complete weights/v<N> (every published version is a whole
                         Hugging Face model directory, `agentrl.trainer.export`)
    runs/demo@v12        that run's weights/v12 (`--version 12` says the same for the main target)
    /models/qwen-7b      any model directory (config.json, tokenizer, chat template)
    http://host:8000/v1#policy   an endpoint and the model name it serves (`--base-url URL --model NAME`)
    expert               each task's scripted expert (no model: the ceiling of the env and its grader,
                         e.g. BFCL's ground truth replayed and scored by bfcl-eval's checker)

Standard library only: resolving a target must not import torch or vLLM.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

EXPERT = "expert"


@dataclass(frozen=True)
class Target:
    label: str
    model_dir: Path | None = None
    """The model directory of a local target (None for an endpoint)."""
    run_dir: Path | None = None
    version: int | None = None
    base_url: str | None = None
    model: str | None = None
    """The endpoint's model name."""
    api_key_env: str = "OPENAI_API_KEY"
    expert: bool = False
    """The tasks' scripted experts play (through the controller's expert route, turned on for this evaluation)."""

    @property
    def is_endpoint(self) -> bool:
        return self.base_url is not None

    def api_key(self) -> str:
        return os.environ.get(self.api_key_env, "") or "none"

    def describe(self) -> str:
        if self.expert:
            return "the tasks' scripted experts"
        if self.is_endpoint:
            return f"endpoint {self.base_url} (model {self.model})"
        if self.run_dir is not None:
            return f"run {self.run_dir} weights v{self.version} ({self.model_dir})"
        return f"model directory {self.model_dir}"


def versions(run_dir: Path) -> list[int]:
    """The complete published versions of a run (a `config.json` inside), oldest first."""
    d = run_dir / "weights"
    found = [int(p.name[1:]) for p in d.glob("v*") if p.name[1:].isdigit() and (p / "config.json").exists()] \
        if d.is_dir() else []
    return sorted(found)


def is_run_dir(path: Path) -> bool:
    return (path / "weights").is_dir() or ((path / "config.yaml").exists() and not (path / "config.json").exists())


def resolve(spec: str, version: int | None = None, model: str | None = None, api_key_env: str = "OPENAI_API_KEY",
            label: str | None = None) -> Target:
    """The target `spec` names (module docstring). Raises FileNotFoundError / ValueError saying what is missing."""
    if spec == EXPERT:
        if version is not None:
            raise ValueError("--version applies to a run dir, not to the scripted expert")
        return Target(label or "scripted expert", expert=True)
    if spec.startswith(("http://", "https://")):
        url, _, name = spec.partition("#")
        name = name or model
        if not name:
            raise ValueError(f"{spec}: an endpoint needs the model name it serves (URL#NAME or --model NAME)")
        return Target(label or name, base_url=url, model=name, api_key_env=api_key_env)
    path_s, _, v = spec.rpartition("@v") if "@v" in spec else (spec, "", "")
    if v:
        if not v.isdigit():
            raise ValueError(f"{spec}: a version is written RUN_DIR@v<N>")
        version = int(v)
    path = Path(path_s).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such run or model directory")
    if is_run_dir(path):
        have = versions(path)
        if not have:
            raise FileNotFoundError(f"{path}: a run dir without published weights (weights/v<N>/config.json); "
                                    "export a checkpoint with `python -m jobs.export RUN_DIR OUT`")
        if version is None:
            version = have[-1]
        elif version not in have:
            raise FileNotFoundError(f"{path}: weights v{version} are not on disk (have {have}); "
                                    f"`python -m jobs.export {path} OUT --version {version}` rebuilds them "
                                    "from a checkpoint")
        return Target(label or f"{path.name} v{version}", model_dir=path / "weights" / f"v{version}", run_dir=path,
                      version=version)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path}: neither a run dir (weights/) nor a model directory (config.json)")
    if version is not None:
        raise ValueError(f"{path}: --version applies to a run dir, not to a model directory")
    return Target(label or path.name, model_dir=path)
