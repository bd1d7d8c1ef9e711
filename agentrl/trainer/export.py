"""A run's policy as a model directory anyone can serve: `python -m jobs.export RUN_DIR [--version N] OUT`.

Every published version (`weights/v<N>/`) already is a complete Hugging Face directory in the model's
dtype, carrying the chat template the run used (`model.chat_template`, or the base directory's own); only the
newest `keep_last` are kept, so an older version (or one whose weights were pruned) is rebuilt from the trainer
checkpoint that holds it: the base model, the checkpoint's model tensors (DCP, any layout it was written with),
then the same writer the trainer publishes with, the run's template included.
"""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from agentrl.trainer import checkpoint
from agentrl.transport import weights as weights_io

log = logging.getLogger("agentrl.export")


def base_model(run_dir: Path) -> tuple[Path, str | None]:
    """(the model directory the run started from: `model.path`, or the tiny model it built; the template the run
    used instead of that directory's own, `model.chat_template`, as text, or None)."""
    from agentrl.config import chat_template_text, load_config

    cfg = load_config(str(run_dir / "config.yaml"))
    base = Path(cfg.model.path) if cfg.model.path else run_dir / "model"
    return base, chat_template_text(cfg.model.chat_template, base) if cfg.model.chat_template else None


def available(run_dir: Path) -> tuple[list[int], dict[int, Path]]:
    """(published versions on disk, checkpoint directory per policy version)."""
    d = run_dir / "weights"
    published = sorted(int(p.name[1:]) for p in d.glob("v*") if p.name[1:].isdigit() and
                       (p / weights_io.WEIGHTS_FILE).exists()) if d.exists() else []
    by_version = {}
    for c in checkpoint.checkpoints(run_dir):
        by_version[int(json.loads((c / checkpoint.STATE_FILE).read_text())["policy_version"])] = c
    return published, by_version


def export(run_dir: str | Path, out: str | Path, version: int | None = None) -> tuple[Path, int, str]:
    """Write version `version` (default: the newest there is) of the run's policy to `out`.

    Returns (out, the version written, where it came from: "weights" or "checkpoint")."""
    run_dir, out = Path(run_dir), Path(out)
    published, ckpts = available(run_dir)
    if version is None:
        version = max([*published, *ckpts], default=None)
        if version is None:
            raise FileNotFoundError(f"{run_dir}: no published weights and no checkpoint to export")
    if out.exists():
        raise FileExistsError(f"{out} exists; export writes a new directory")
    if version in published:
        src = weights_io.version_dir(run_dir, version)
        tmp = out.with_name(f".tmp-{out.name}")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp)
        tmp.rename(out)
        return out, version, "weights"
    if version not in ckpts:
        raise FileNotFoundError(f"{run_dir}: version {version} is neither published (weights/: {published}) nor "
                                f"in a checkpoint (policy versions {sorted(ckpts)})")
    import torch
    from transformers import AutoModelForCausalLM

    base, template = base_model(run_dir)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    state = checkpoint.load_model_weights(ckpts[version], model)
    weights_io.save_model_dir(out, model.state_dict(), base, {"version": version, "step": state.step,
                                                              "exported_from": str(ckpts[version])}, template)
    return out, version, "checkpoint"
