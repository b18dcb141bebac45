"""The training objective of the paper (§4, label smoothing ε=0.1), and what evaluation needs of it."""
from __future__ import annotations

from typing import NamedTuple

import torch.nn.functional as F
from torch import Tensor


class LossOutput(NamedTuple):
    loss: Tensor  # label-smoothed loss, mean over non-pad tokens (what is optimised)
    nll_sum: Tensor  # plain negative log-likelihood, summed (for perplexity across batches)
    n_tokens: Tensor


def _per_token(logits: Tensor, target: Tensor, smoothing: float) -> tuple[Tensor, Tensor]:
    """(label-smoothed loss, plain NLL) of each position, in float32."""
    logp = F.log_softmax(logits.float(), dim=-1)
    nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return (1.0 - smoothing) * nll - smoothing * logp.mean(dim=-1), nll


def label_smoothed_loss(logits: Tensor, target: Tensor, smoothing: float = 0.1, ignore_index: int = 0,
                        counted: Tensor | None = None) -> LossOutput:
    """Cross-entropy with uniform label smoothing (computed in float32), a mean over the positions
    `counted` (B, N) marks: by default those whose target is not padding (`ignore_index`)."""
    per_token, nll = _per_token(logits, target, smoothing)
    keep = target != ignore_index if counted is None else counted
    n_tokens = keep.sum()
    loss = (per_token * keep).sum() / n_tokens.clamp_min(1)
    return LossOutput(loss, (nll * keep).sum(), n_tokens)
