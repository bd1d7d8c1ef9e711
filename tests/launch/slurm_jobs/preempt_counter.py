"""A stand-in trainer for the requeue test: consumes ids t0, t1, ... one per step, checkpointing ONLY when
preempted (and at the end), through agentrl.launch.preempt. Progress since the last checkpoint lives in
memory, so a missed signal or a lost checkpoint shows up as a ledger with gaps or repeats.

    python preempt_counter.py STATE_DIR STEPS STEP_S
"""
import json
import os
import sys
import time
from pathlib import Path

from agentrl.launch.preempt import Preemption

state_dir, steps, step_s = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
ckpt = state_dir / "ckpt.json"
preemption = Preemption().install()
state = json.loads(ckpt.read_text()) if ckpt.exists() else {"step": 0, "consumed": []}
restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
with open(state_dir / "starts.log", "a") as f:
    f.write(f"{restart} {state['step']}\n")


def save() -> None:
    tmp = ckpt.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, ckpt)


while state["step"] < steps:
    time.sleep(step_s)  # "the step"
    state["consumed"].append(f"t{state['step']}")
    state["step"] += 1
    (state_dir / "progress").write_text(str(state["step"]))
    if preemption.requested:
        save()
        print(f"preempted by {preemption.received.name} after step {state['step']}", flush=True)
        preemption.exit_for_requeue()
save()
(state_dir / "done").write_text("ok")
