"""The training objective of the paper (§4, label smoothing ε=0.1), and what evaluation needs of it."""
from __future__ import annotations

from typing import NamedTuple

import torch.nn.functional as F
from torch import Tensor


class LossOutput(NamedTuple):
    loss: Tensor  # label-smoothed loss, mean over non-pad tokens (what is optimised)
    nll_sum: Tensor  # plain negative log-likelihood, summed (for perplexity across batches)
    n_tokens: Tensor


def label_smoothed_loss(logits: Tensor, target: Tensor, smoothing: float = 0.1, ignore_index: int = 0) -> LossOutput:
    """Cross-entropy with uniform label smoothing, ignoring padding (computed in float32)."""
    logp = F.log_softmax(logits.float(), dim=-1)
    keep = target != ignore_index
    nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    smooth = -logp.mean(dim=-1)
    per_token = (1.0 - smoothing) * nll + smoothing * smooth
    n_tokens = keep.sum()
    loss = (per_token * keep).sum() / n_tokens.clamp_min(1)
    return LossOutput(loss, (nll * keep).sum(), n_tokens)
