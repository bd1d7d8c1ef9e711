"""Names in a run directory that the launcher reads without the trainer's imports (standard library only: the
launcher on a login node has no torch). `agentrl.trainer.checkpoint` writes them; `agentrl.launch.fork` copies them."""
from __future__ import annotations

CKPT_DIR = "ckpt"
"""Trainer checkpoints: ckpt/step-<N>/ (`agentrl.trainer.checkpoint`)."""
STATE_FILE = "trainer.json"
"""In a checkpoint, written last: it exists exactly when the checkpoint is whole."""
WARM_FILE = "warm_start.json"
"""In a checkpoint: the warm start's own state (the step-0 checkpoint a warm start ends with; a control run's)."""
REFERENCE_FILE = "reference.safetensors"
"""Beside the checkpoints: the frozen KL reference (the warm-started weights)."""
EXPERT_SHARDS = "shards/expert-0"
"""The expert demonstrations the warm start trains on."""
