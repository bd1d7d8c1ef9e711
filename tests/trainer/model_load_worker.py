"""One rank of test_model_load.py's FSDP2 load: started twice by the test (forked from the forkserver of
trainer_procs.py). Each rank loads the policy sharded and the reference in bf16, records how many bytes of
parameters it holds, gathers the whole weights on rank 0 in bf16 and one rl-style forward, and saves it all
to OUT_DIR/rank<r>.pt."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from agentrl.trainer.parallel import Parallel


def gathered_state_dict(model: torch.nn.Module, par: Parallel, dtype: torch.dtype | None = None
                        ) -> dict[str, torch.Tensor]:
    """The whole weights on CPU on rank 0 (an empty dict elsewhere), each tensor in `dtype`, all at once (the
    trainer streams them with `gather_tensors` instead; a test wants them whole). Collective under FSDP2."""
    from agentrl.trainer.model_load import gather_tensors

    if par.distributed and not par.sharded:
        sd = par.full_state_dict(model)
        return {k: v.to(dtype) if dtype is not None and v.is_floating_point() else v for k, v in sd.items()}
    return dict(gather_tensors(model, par, dtype))


def main(model_dir: Path, out: Path, tied_dir: Path | None = None) -> None:
    from agentrl.trainer import checkpoint
    from agentrl.trainer.learner import publish_weights
    from agentrl.trainer.model_load import load_policy, load_reference
    from agentrl.trainer.parallel import Parallel, close_distributed, dist_env, init_distributed

    env = dist_env()
    device = init_distributed(env)
    try:
        par = Parallel("fsdp2", env, device, mixed_precision="bf16")
        policy = load_policy(model_dir, 1, par)
        ref = load_reference(model_dir, 1, par)
        local = sum(p.to_local().numel() * p.to_local().element_size() for p in policy.parameters())
        ref_dtypes = sorted({str(p.to_local().dtype) for p in ref.parameters()})
        policy_dtypes = sorted({str(p.to_local().dtype) for p in policy.parameters()})
        whole = gathered_state_dict(policy, par, torch.bfloat16)
        ids = torch.arange(1, 17)[None]
        with torch.no_grad():
            logits = policy(input_ids=ids).logits.float()
        buffers = {n: b.clone() for n, b in policy.named_buffers()}
        whole32 = gathered_state_dict(policy, par)  # the float32 master weights as loaded
        with torch.no_grad():  # a "trained" policy: no longer the files' values, nor bf16-representable
            for p in policy.parameters():
                p.add_(0.01)
        trained = gathered_state_dict(policy, par)
        publish_weights(out / "run", 1, policy, par, model_dir)  # streamed, in the model's dtype (bf16)
        checkpoint.save_reference(out / "run", policy, par)  # streamed, float32
        ref2 = load_reference(model_dir, 1, Parallel("fsdp2", env, device, mixed_precision="fp32"),
                              checkpoint.reference_file(out / "run"))
        ref2_whole = gathered_state_dict(ref2, par)
        torch.save({"local_bytes": local, "ref_dtypes": ref_dtypes, "whole": whole, "logits": logits,
                    "buffers": buffers, "policy_dtypes": policy_dtypes, "whole32": whole32, "trained": trained,
                    "ref2": ref2_whole}, out / f"rank{env.rank}.pt")
        if tied_dir is not None:  # tied embeddings (the tiny model's): one parameter, both names published
            torch.save(gathered_state_dict(load_policy(tied_dir, 1, par), par), out / f"tied{env.rank}.pt")
    finally:
        close_distributed()
