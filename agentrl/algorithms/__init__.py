"""Pure tensor math of the algorithm (docs/architecture.md §5): advantages, task normalization, the PPO loss, KL
estimators and staleness. Imports torch only; no torch.distributed, MPI, vLLM, HDF5 or config, so
each function is tested alone on CPU. Variants are picked from the dicts below by config strings.
"""
from agentrl.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    grpo_advantages,
    informative_groups,
    reinforce_pp_advantages,
    rloo_advantages,
    token_advantages,
)
from agentrl.algorithms.kl import KL_ESTIMATORS, kl_k1, kl_k2, kl_k3
from agentrl.algorithms.offpolicy import (
    BEHAVIOUR_WEIGHTS,
    PROXIMAL_LOGP,
    decoupled_ppo_loss,
    tis_ppo_loss,
    version_alpha,
)
from agentrl.algorithms.ppo import LOSS_REDUCTIONS, entropy_from_logits, masked_mean, ppo_loss
from agentrl.algorithms.staleness import fresh_mask, staleness, truncated_is_weights
from agentrl.algorithms.task_norm import task_normalize, task_stats

__all__ = [
    "ADVANTAGE_ESTIMATORS", "BEHAVIOUR_WEIGHTS", "KL_ESTIMATORS", "LOSS_REDUCTIONS", "PROXIMAL_LOGP",
    "decoupled_ppo_loss", "entropy_from_logits", "fresh_mask", "grpo_advantages", "informative_groups",
    "kl_k1", "kl_k2", "kl_k3", "masked_mean",
    "ppo_loss", "reinforce_pp_advantages", "rloo_advantages", "staleness", "task_normalize", "task_stats",
    "tis_ppo_loss", "token_advantages", "truncated_is_weights", "version_alpha",
]
