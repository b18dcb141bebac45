"""Perplexity per evaluation length and per token-position bucket, exact under DDP.

The state is two tables of sums, negative log-likelihood and token count, indexed by (evaluation
length, position bucket); torchmetrics reduces them by summing across ranks, so a split sharded
over processes gives the one-process numbers (ratios of sums, never means of means).

Position buckets double from the training length: [0, T), [T, 2T), [2T, 4T), ... — at an
evaluation length of 8T the last bucket holds the tokens that saw more context than any training
window, where a scheme that does not extrapolate falls apart (the ALiBi paper's question).
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torchmetrics import Metric

from relpos_lab.api import EvalResult


def position_buckets(train_length: int, longest: int) -> list[int]:
    """Lower bounds of the position buckets: 0, T, 2T, 4T, ... below `longest`."""
    bounds, bound = [0], train_length
    while bound < longest:
        bounds.append(bound)
        bound *= 2
    return bounds


def bucket_name(bounds: Sequence[int], i: int, longest: int) -> str:
    high = bounds[i + 1] if i + 1 < len(bounds) else longest
    return f"ppl_pos{bounds[i]}-{high - 1}"


class NLLTable(Metric):
    """Sums of NLL and token counts in a (lengths × buckets) table."""

    full_state_update = False

    def __init__(self, n_lengths: int, n_buckets: int):
        super().__init__()
        self.add_state("nll", torch.zeros(n_lengths, n_buckets, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("tokens", torch.zeros(n_lengths, n_buckets, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, nll: Tensor, length_index: Tensor, bucket_index: Tensor) -> None:
        """One entry per scored token: its NLL, its evaluation length's and position bucket's index."""
        flat = length_index * self.nll.shape[1] + bucket_index
        self.nll.view(-1).index_add_(0, flat, nll.to(torch.float64))
        self.tokens.view(-1).index_add_(0, flat, torch.ones_like(nll, dtype=torch.float64))

    def compute(self) -> tuple[Tensor, Tensor]:
        return self.nll, self.tokens


class PerplexityEvaluation(nn.Module):
    """A split's language-model evaluation: `metrics` loss / ppl at the main length (the training
    length) and `by_length` {eval length: {loss, ppl, ppl_pos<a>-<b>..., n = tokens scored}}."""

    def __init__(self, lengths: Sequence[int], train_length: int, details=None):
        super().__init__()
        self.lengths = [int(n) for n in lengths]
        self.train_length = train_length
        self.bounds = position_buckets(train_length, max(self.lengths))
        self.table = NLLTable(len(self.lengths), len(self.bounds))
        self.details = details  # () -> {name: signature}, asked at compute time

    def update(self, nll: Tensor, mask: Tensor, lengths: Tensor) -> None:
        """`nll` (B, T) per target, `mask` (B, T) which are scored, `lengths` (B,) each row's
        evaluation length; positions are the column index."""
        rows, cols = mask.nonzero(as_tuple=True)
        index = {n: i for i, n in enumerate(self.lengths)}
        length_index = torch.tensor([index[int(n)] for n in lengths.tolist()], device=nll.device)[rows]
        bounds = torch.tensor(self.bounds, device=nll.device)
        bucket = torch.searchsorted(bounds, cols, right=True) - 1
        self.table.update(nll[rows, cols], length_index, bucket)

    def compute(self) -> EvalResult:
        with warnings.catch_warnings():  # a rank that saw no batch still joins the reduction
            warnings.filterwarnings("ignore", message=".*compute.*before.*update.*")
            nll, tokens = (t.cpu() for t in self.table.compute())
        by_length, metrics = {}, {}
        for i, length in enumerate(self.lengths):
            n = float(tokens[i].sum())
            if n == 0:
                continue
            loss = float(nll[i].sum()) / n
            row = {"loss": loss, "ppl": _exp(loss), "n": n}
            for j in range(len(self.bounds)):
                if tokens[i, j] > 0:
                    row[bucket_name(self.bounds, j, length)] = _exp(float(nll[i, j] / tokens[i, j]))
            by_length[length] = row
        main = by_length.get(self.train_length)
        if main is not None:
            metrics = {"loss": main["loss"], "ppl": main["ppl"]}
        details = self.details() if self.details else None
        return EvalResult(metrics, by_length, details or None)

    def reset(self) -> None:
        self.table.reset()


def _exp(loss: float) -> float:
    return math.exp(min(loss, 50.0))
