"""Trainer checkpoints in the run dir (docs/architecture.md §7, §8), written atomically and resumable on any layout.

    ckpt/step-<N>/state/            model + optimizer state, torch.distributed.checkpoint (DCP) format: one
                                    file per rank plus `.metadata`; loads back into 1 or M ranks, DDP or FSDP2
    ckpt/step-<N>/rng-<rank>.pt     each rank's RNG states (python, numpy, torch CPU, CUDA)
    ckpt/step-<N>/trainer.json      step, policy version, LR scheduler state, running statistics and the
                                    ledger of consumed trajectory ids (written last)
    ckpt/step-<N>/warm_start.json   the warm start's schedule, draws and rates (its optimizer's tensors are in
                                    state/ as `warm_optim`): in the step-0 checkpoint a warm start ends with, and
                                    in every checkpoint of a control run (`trainer.update=warm_start`)

N counts completed RL steps. Every rank writes into `ckpt/.tmp-step-<N>`; once all have finished, rank 0
writes trainer.json, fsyncs, and renames the directory to `step-<N>`, so a crash at any moment leaves
either a whole checkpoint or none under a `step-*` name (`latest` ignores anything else). Older
checkpoints beyond `keep` go only after the new one is in place; a warm start's step-0 checkpoint stays (another
run of the same seed starts from it: `trainer.warm_start_from`). The run dir must be on a filesystem all
trainer ranks share (it is, for the shards and weights too).

What this module is not: weights for the rollout engines (`agentrl.transport.weights`, safetensors, a
version per step); those are not a way to resume, since they lack the optimizer state.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.fsio import fsync_dir
from agentrl.run_files import CKPT_DIR, REFERENCE_FILE, STATE_FILE, WARM_FILE
from agentrl.trainer.parallel import Parallel

STEP_DIR = re.compile(r"^step-(\d+)$")
WARM_OPTIM = "warm_optim"


@dataclass
class TrainerState:
    """What a resumed trainer needs beyond the model and optimizer tensors."""

    step: int = 0
    """RL steps completed; the next step reads rollout shard `step`."""
    policy_version: int = 0
    """Version of the weights the model holds (published as weights/v<policy_version>)."""
    consumed: set[str] = field(default_factory=set)
    """Ledger: ids of every trajectory a step has taken (trained on or dropped with a counter). A resumed
    trainer skips them, so nothing is trained twice."""
    stats: dict[str, float] = field(default_factory=dict)
    """Running totals over the whole run (trajectories trained, dropped by reason, action tokens)."""

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "policy_version": self.policy_version, "stats": self.stats,
                "consumed": sorted(self.consumed)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TrainerState:
        return cls(int(d["step"]), int(d["policy_version"]), set(d["consumed"]),
                   {k: float(v) for k, v in d["stats"].items()})


def ckpt_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / CKPT_DIR


def latest(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint directory, or None."""
    root = ckpt_root(run_dir)
    if not root.is_dir():
        return None
    done = [(int(m.group(1)), p) for p in root.iterdir()
            if (m := STEP_DIR.match(p.name)) and (p / STATE_FILE).is_file()]
    return max(done)[1] if done else None


def save(run_dir: str | Path, state: TrainerState, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         scheduler: Any, par: Parallel, keep: int = 2, extra: dict[str, Any] | None = None,
         warm: tuple[torch.optim.Optimizer, dict[str, Any]] | None = None) -> Path:
    """Write ckpt/step-<state.step> atomically. Collective: every trainer rank calls it.

    `extra` (rank 0's): more JSON files, by name, written into the checkpoint before it is renamed into
    place, so that they exist exactly when the checkpoint does (the trainer role's queue ledger: a kill
    between the rename and a later write would leave a checkpoint without it). `warm`: the warm start's
    optimizer (its tensors go into state/ beside the model's) and its `state_dict` (`WARM_FILE`)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    root = ckpt_root(run_dir)
    final = root / f"step-{state.step}"
    tmp = root / f".tmp-step-{state.step}"
    if par.is_main:
        shutil.rmtree(tmp, ignore_errors=True)  # a half-written attempt of an earlier, killed run
        tmp.mkdir(parents=True)
    par.barrier()
    tensors = _tensor_state(model, optimizer, stepped := bool(optimizer.state))
    if warm is not None:
        tensors[WARM_OPTIM] = get_optimizer_state_dict(model, warm[0])
        extra = {**(extra or {}), WARM_FILE: warm[1]}
    dcp.save(tensors, checkpoint_id=str(tmp / "state"), no_dist=not par.distributed)
    _write(tmp / f"rng-{par.rank}.pt", lambda f: torch.save(_rng_state(), f))
    par.barrier()
    if par.is_main:
        body = {**state.to_json(), "scheduler": scheduler.state_dict() if scheduler is not None else None,
                "optimizer_stepped": stepped, "world_size": par.world_size, "parallel": par.kind}
        for name, doc in (extra or {}).items():
            _write(tmp / name, lambda f, doc=doc: f.write(json.dumps(doc).encode()))
        _write(tmp / STATE_FILE, lambda f: f.write(json.dumps(body).encode()))
        fsync_dir(tmp)
        if final.exists():  # the same step again (a resumed run re-checkpointing): replace it whole
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(root)
        _prune(root, keep)
    par.barrier()
    return final


def load(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
         par: Parallel, warm_opt: torch.optim.Optimizer | None = None) -> TrainerState:
    """Restore model, optimizer, scheduler and this rank's RNG states from `path` (and with `warm_opt`, the
    warm start's optimizer, which the checkpoint must hold: `warm_state`). Collective.

    The model and optimizer must be wrapped and built already (FSDP2 shards are loaded in place).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
        set_state_dict,
    )

    path = Path(path)
    body = json.loads((path / STATE_FILE).read_text())
    stepped = bool(body["optimizer_stepped"])
    sd = _tensor_state(model, optimizer, stepped)
    if warm_opt is not None:
        if warm_state(path) is None:
            raise FileNotFoundError(f"{path} holds no warm-start state ({WARM_FILE})")
        sd[WARM_OPTIM] = get_optimizer_state_dict(model, warm_opt)
    dcp.load(sd, checkpoint_id=str(path / "state"), no_dist=not par.distributed)
    if stepped:
        set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    else:
        set_model_state_dict(model, sd["model"])
    if warm_opt is not None:
        set_optimizer_state_dict(model, warm_opt, sd[WARM_OPTIM])
    if scheduler is not None and body.get("scheduler") is not None:
        scheduler.load_state_dict(body["scheduler"])
    rng = path / f"rng-{par.rank}.pt"
    if rng.exists():  # absent when resuming on more ranks than wrote the checkpoint: keep the seeded state
        _set_rng_state(torch.load(rng, weights_only=False))
    return TrainerState.from_json(body)


def load_model_weights(path: str | Path, model: torch.nn.Module) -> TrainerState:
    """Only the model's tensors of checkpoint `path`, into an unwrapped model in one process (an export or an
    evaluation of a checkpoint: no optimizer, no process group); returns the checkpoint's trainer state."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    path = Path(path)
    sd = {"model": get_model_state_dict(model)}
    dcp.load(sd, checkpoint_id=str(path / "state"), no_dist=True)
    set_model_state_dict(model, sd["model"])
    return TrainerState.from_json(json.loads((path / STATE_FILE).read_text()))


def warm_state(path: str | Path) -> dict[str, Any] | None:
    """The warm start's state in checkpoint `path` (`WARM_FILE`), or None when it holds none."""
    f = Path(path) / WARM_FILE
    return json.loads(f.read_text()) if f.is_file() else None


def checkpoints(run_dir: str | Path) -> list[Path]:
    """Every complete checkpoint directory, oldest first."""
    root = ckpt_root(run_dir)
    if not root.is_dir():
        return []
    done = [(int(m.group(1)), p) for p in root.iterdir()
            if (m := STEP_DIR.match(p.name)) and (p / STATE_FILE).is_file()]
    return [p for _, p in sorted(done)]


# ------------------------------------------------------------------------------------------------ helpers

def _tensor_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, with_optimizer: bool) -> dict[str, Any]:
    """Model (and optimizer) state keyed by parameter names, sharded as the model is (DTensors under FSDP2).

    An optimizer that has not stepped yet is left out: asking DCP for its state would have it take a
    zero-learning-rate step to create the state, which leaves Adam's step count at 1 and so changes the
    bias correction of every later step.
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if not with_optimizer:
        return {"model": get_model_state_dict(model)}
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd}


def _rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def _set_rng_state(s: dict[str, Any]) -> None:
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])
    if s.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def _write(path: Path, fill) -> None:
    with open(path, "wb") as f:
        fill(f)
        f.flush()
        os.fsync(f.fileno())


def _prune(root: Path, keep: int) -> None:
    """Keep the newest `keep` checkpoints, and a warm start's step-0 (what `trainer.warm_start_from` forks)."""
    steps = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name)))
    for n, p in steps[:-keep]:
        if n == 0 and (p / WARM_FILE).is_file():
            continue
        shutil.rmtree(p, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ reference


def save_reference(run_dir: str | Path, model: torch.nn.Module, par: Parallel) -> Path:
    """Keep the frozen KL reference (the warm-started weights, in the model's training dtype) beside the
    checkpoints, atomically: the published weights/v0 it equals is pruned as versions advance, and a resumed
    run needs it again. Gathered and written one tensor at a time (`model_load.gather_tensors`). Collective."""
    from agentrl.trainer.model_load import gather_tensors, tensor_specs
    from agentrl.transport.tensor_file import write_tensors

    root = ckpt_root(run_dir)
    final = root / REFERENCE_FILE
    tensors = gather_tensors(model, par)
    if not par.is_main:
        for _ in tensors:  # the other ranks send their shards
            pass
        par.barrier()
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{REFERENCE_FILE}.{os.getpid()}.tmp"
    write_tensors(tmp, tensor_specs(model, par), tensors)  # fsynced
    os.replace(tmp, final)
    fsync_dir(root)
    par.barrier()
    return final


def reference_file(run_dir: str | Path) -> Path | None:
    """The saved KL reference (`save_reference`), or None when the run has none."""
    path = ckpt_root(run_dir) / REFERENCE_FILE
    return path if path.exists() else None
