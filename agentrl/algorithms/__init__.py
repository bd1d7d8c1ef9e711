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
from agentrl.algorithms.offpolicy import BEHAVIOUR_WEIGHTS, decoupled_ppo_loss, tis_ppo_loss
from agentrl.algorithms.ppo import LOSS_REDUCTIONS, masked_mean, ppo_loss
from agentrl.algorithms.staleness import admit_limit, is_stale, trajectory_staleness
from agentrl.algorithms.task_norm import task_normalize, task_stats

__all__ = [
    "ADVANTAGE_ESTIMATORS", "BEHAVIOUR_WEIGHTS", "KL_ESTIMATORS", "LOSS_REDUCTIONS", "admit_limit",
    "decoupled_ppo_loss", "grpo_advantages", "informative_groups", "is_stale", "kl_k1", "kl_k2", "kl_k3",
    "masked_mean", "ppo_loss", "reinforce_pp_advantages", "rloo_advantages", "task_normalize", "task_stats",
    "tis_ppo_loss", "token_advantages", "trajectory_staleness",
]
