"""One rank of the data-parallel trainer test: test_parallel.py starts two processes that each run `main`
(forked from a forkserver, see trainer_procs.py); by hand:

    RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=p python tests/trainer/dist_trainer_worker.py OUT_DIR

For each layout (DDP padded, DDP packed, FSDP2 packed; tied and untied heads) it takes one `rl_step` on the
shared batch, with KL to a frozen reference, an entropy bonus, temperature 0.9 and active gradient clipping, and rank 0 saves the whole updated
weights and the step's statistics to OUT_DIR/<layout>.pt. Under FSDP2 it then checkpoints, restores into
a fresh sharded model and optimizer, and takes a second step on both: OUT_DIR/fsdp2-resumed.pt must
equal OUT_DIR/fsdp2-continued.pt.

The model, batch and hyper-parameters come from the functions below, which the test imports to compute
the single-rank reference on the whole batch.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from agentrl.config import AlgoConfig, TrainerConfig
from agentrl.types import Status, Trajectory, TrajectoryBuilder

VOCAB = 96


def tiny_model(seed: int, tied: bool = True) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=tied,
                      max_position_embeddings=128, torch_dtype="float32")
    return Qwen2ForCausalLM(cfg)


def trajectories(seed: int = 0) -> list[Trajectory]:
    """Two tasks, three groups each of four samples, 2–3 turns of random lengths."""
    rng = np.random.default_rng(seed)
    out = []
    for task in ("a", "b"):
        for g in range(3):
            for k in range(4):
                b = TrajectoryBuilder()
                for _ in range(int(rng.integers(1, 5))):
                    b.add_context(rng.integers(3, VOCAB, int(rng.integers(3, 10))).tolist())
                    n = int(rng.integers(2, 8))
                    b.add_action(rng.integers(3, VOCAB, n).tolist(), (-rng.random(n) * 4).tolist(), 0, 0)
                out.append(b.build(traj_id=f"{task}{g}{k}", task=task, index=str(g), group_id=f"{task}-{g}",
                                   reward=float(k % 2) * (1 + g), status=Status.COMPLETED, num_turns=2))
    return out


ALGO = AlgoConfig(kl_coef=0.1, entropy_coef=0.01)
TEMPERATURE = 0.9


def trainer_config(packed: bool, micro_batch_tokens: int) -> TrainerConfig:
    return TrainerConfig(grad_clip=0.05, micro_batch_tokens=micro_batch_tokens, packing=packed)


LAYOUTS = {"ddp-padded": ("ddp", False, True), "ddp-packed": ("ddp", True, True), "fsdp2-packed": ("fsdp2", True, True),
           "ddp-packed-untied": ("ddp", True, False), "fsdp2-packed-untied": ("fsdp2", True, False)}
"""name → (parallel kind, packed, tied head)."""
MICRO_BATCH_TOKENS = 150  # several micro-batches, an odd number of them: one rank runs an empty stand-in


def reference_model(tied: bool = True) -> torch.nn.Module:
    ref = tiny_model(0, tied)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return ref


def main(out: Path) -> None:
    from agentrl.trainer import checkpoint
    from agentrl.trainer.batch import collate
    from agentrl.trainer.parallel import Parallel, close_distributed, dist_env, init_distributed
    from agentrl.trainer.step import rl_step

    torch.set_num_threads(1)
    env = dist_env()
    device = init_distributed(env)
    trajs = trajectories()
    batch = collate(trajs, [t.reward for t in trajs], pad_id=0)
    try:
        for name, (kind, packed, tied) in LAYOUTS.items():
            par = Parallel(kind, env, device)
            model = par.wrap(tiny_model(0, tied))
            ref = par.wrap_frozen(reference_model(tied))
            opt = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)
            t = trainer_config(packed, MICRO_BATCH_TOKENS)
            stats = rl_step(model, opt, batch, ALGO, t, TEMPERATURE, ref, par)
            state = par.full_state_dict(model)
            if par.is_main:
                torch.save({"state": state, "stats": stats}, out / f"{name}.pt")
            if name != "fsdp2-packed":
                continue
            # checkpoint round trip on the sharded layout: restore into fresh shards, then step both
            ts = checkpoint.TrainerState(step=1, policy_version=1, consumed={t.traj_id for t in trajs})
            checkpoint.save(out / "run", ts, model, opt, None, par)
            model2 = par.wrap(tiny_model(5))
            opt2 = torch.optim.SGD(model2.parameters(), lr=1.0, momentum=0.9)
            back = checkpoint.load(checkpoint.latest(out / "run"), model2, opt2, None, par)
            assert back.consumed == ts.consumed and back.step == 1
            for tag, (m, o) in {"continued": (model, opt), "resumed": (model2, opt2)}.items():
                rl_step(m, o, batch, ALGO, t, TEMPERATURE, ref, par)
                state = par.full_state_dict(m)
                if par.is_main:
                    torch.save({"state": state}, out / f"fsdp2-{tag}.pt")
    finally:
        close_distributed()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
