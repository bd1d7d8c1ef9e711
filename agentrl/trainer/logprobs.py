"""Per-token log-probs of a causal LM for the targets of a padded batch."""
from __future__ import annotations

import torch


def token_logprobs(model: torch.nn.Module, tokens: torch.Tensor, attention: torch.Tensor,
                   temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of tokens[:, 1:] under the model, logits divided by `temperature` (as the sampler did).

    Returns (logp [B, T-1], logits [B, T-1, V]).
    """
    logits = model(input_ids=tokens, attention_mask=attention).logits[:, :-1].float()  # [B, T-1, V]
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, 1:, None]).squeeze(-1)  # [B, T-1]
    return logp, logits
