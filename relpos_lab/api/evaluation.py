"""Running evaluation of one split: a task's metrics over all examples and per length bucket.

Validation, the final test and the `eval` command all accumulate into an `Evaluation`, which is
what keeps their numbers identical. Everything is a torchmetrics state (sums and counts), so
`compute` reduces correctly across DDP ranks. Length buckets are fixed when the evaluation is
built: every rank then holds the same metrics and runs the same collectives, even when a rank
saw no example of some length.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torchmetrics import MeanMetric, MetricCollection, SumMetric


class EvalResult(NamedTuple):
    metrics: dict[str, float]  # {"exact_match": 0.93, "loss": 0.12, ...}
    by_length: dict[int, dict[str, float]] | None  # {length: {metric: value, "n": count}}
    # How the numbers were computed, for results.json and the loggers (e.g. sacrebleu signatures).
    details: dict[str, str] | None = None
    # Whole-corpus text, one line per example in split order ({"hyp": [...], "ref": [...]}),
    # written to <run dir>/outputs/<split>.<name> so the scores can be recomputed from files.
    outputs: dict[str, list[str]] | None = None


class Evaluation(nn.Module):
    """Accumulates `metrics` overall and, when `buckets` are given, per bucket of example length.

    `update(*args, lengths=...)` forwards `args` (whatever the metrics' own `update` takes:
    tensors or lists with one entry per example) to the overall metrics, and each bucket's slice
    of them to that bucket's copy of the metrics.
    """

    def __init__(self, metrics: MetricCollection, buckets: Sequence[int] | None = None):
        super().__init__()
        self.metrics = metrics
        self.nll = MeanMetric()
        self.buckets = [int(b) for b in buckets] if buckets is not None else None
        keys = [str(b) for b in self.buckets or []]
        self.bucket_metrics = nn.ModuleDict({k: metrics.clone() for k in keys})
        self.bucket_counts = nn.ModuleDict({k: SumMetric() for k in keys})
        # Whether any rank saw teacher-forced NLL: a metric, so every rank agrees on it and
        # computes nll (a collective) too, even one whose shard of the split is empty.
        self.nll_batches = SumMetric()

    def update(self, *args: Any, lengths: Tensor) -> None:
        self.metrics.update(*args)
        if self.buckets is None:
            return
        lengths = torch.as_tensor(lengths)
        for value in lengths.unique().tolist():
            key = str(int(value))
            if key not in self.bucket_metrics:
                raise ValueError(f"example length {value} has no bucket; buckets are {self.buckets}")
            index = (lengths == value).nonzero().flatten()
            self.bucket_metrics[key].update(*(_take(a, index) for a in args))
            self.bucket_counts[key].update(float(len(index)))

    def update_nll(self, nll_sum: Tensor, n_tokens: Tensor) -> None:
        """Teacher-forced negative log-likelihood, token-weighted (reported as loss and ppl)."""
        n = n_tokens.float().clamp_min(1)
        self.nll.update(nll_sum.float() / n, weight=n)
        self.nll_batches.update(1.0)

    def compute(self) -> EvalResult:
        with warnings.catch_warnings():  # empty buckets are expected; they are dropped below
            warnings.filterwarnings("ignore", message=".*compute.*before.*update.*")
            metrics = {k: float(v) for k, v in self.metrics.compute().items()}
            if float(self.nll_batches.compute()) > 0:
                metrics["loss"] = float(self.nll.compute())
                metrics["ppl"] = math.exp(min(metrics["loss"], 50.0))
            by_length = None
            if self.buckets is not None:
                by_length = {}
                for b in self.buckets:
                    n = float(self.bucket_counts[str(b)].compute())
                    values = {k: float(v) for k, v in self.bucket_metrics[str(b)].compute().items()}
                    if n > 0:
                        by_length[b] = {**values, "n": n}
        return EvalResult(metrics, by_length)

    def reset(self) -> None:
        self.metrics.reset()
        self.nll.reset()
        self.nll_batches.reset()
        for key in self.bucket_metrics:
            self.bucket_metrics[key].reset()
            self.bucket_counts[key].reset()


def _take(x: Any, index: Tensor) -> Any:
    """Rows `index` of a per-example argument (tensor, or list such as strings for BLEU)."""
    if isinstance(x, Tensor):
        return x.index_select(0, index.to(x.device))
    return [x[i] for i in index.tolist()]


def length_generalization(by_length: dict, train_range: tuple[int, int] | None) -> dict[str, float]:
    """The probe's summary numbers: each metric averaged over the buckets inside the training
    range (`<metric>_id`) and over the longer ones (`<metric>_ood`), every bucket weighted alike.

    Buckets shorter than the training range count as neither.
    """
    if not by_length or train_range is None:
        return {}
    lo, hi = train_range
    groups = {"id": [], "ood": []}
    for length, row in by_length.items():
        n = int(length)
        if lo <= n <= hi:
            groups["id"].append(row)
        elif n > hi:
            groups["ood"].append(row)
    out = {}
    for group, rows in groups.items():
        for metric in sorted({m for row in rows for m in row if m != "n"}):
            values = [row[metric] for row in rows if metric in row]
            out[f"{metric}_{group}"] = sum(values) / len(values)
    return out
