"""Corpus BLEU and chrF of detokenized hypotheses, computed by sacrebleu, correct under DDP.

BLEU is a corpus statistic: n-gram matches and totals are summed over all sentences before the
precisions and the brevity penalty are taken, so averaging per-batch (or per-rank) BLEU is wrong.
Two correct ways exist: sum sufficient statistics across ranks, or gather the text. This metric
gathers the text — hypotheses, references and sources, with each example's index — because the
run must write the hypotheses to a file anyway (rank 0 needs all of them), and because scoring the
gathered corpus with sacrebleu's own `corpus_score` makes the number *be* sacrebleu's, for BLEU and
chrF alike, with its signature, rather than a re-implementation that must be kept in agreement
(torchmetrics' SacreBLEUScore smooths differently, and has no signature).

The text travels as torchmetrics "cat" states, so `compute` gathers it across ranks like any
metric. Strings are stored as their UTF-8 bytes in float32 tensors (exact for bytes and for
lengths and indices below 2^24): float32 is the dtype torchmetrics gives the state of a rank that
saw no example, and all ranks must gather tensors of one dtype. The example index sorts the
corpus back into split order and removes the repeats a padded distributed sampler adds.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import torch
from sacrebleu.metrics import BLEU, CHRF
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from relpos_lab.api import EvalResult, Evaluation

TEXTS = ("hyp", "ref", "src")


class CorpusScore(Metric):
    """sacrebleu's corpus BLEU and chrF (0-100) over every example seen on every rank.

    After `compute`, `signatures` holds sacrebleu's signatures and `corpus` the gathered text
    ({"hyp", "ref", "src"}: lists in split order), for results.json and the outputs files.
    """

    full_state_update = False
    higher_is_better = True

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        for name in TEXTS:
            self.add_state(f"{name}_bytes", default=[], dist_reduce_fx="cat")
            self.add_state(f"{name}_lengths", default=[], dist_reduce_fx="cat")
        self.add_state("index", default=[], dist_reduce_fx="cat")
        self.signatures: dict[str, str] = {}
        self.corpus: dict[str, list[str]] = {}

    def update(self, hyps: Sequence[str], refs: Sequence[str], index: Tensor, srcs: Sequence[str]) -> None:
        for name, texts in zip(TEXTS, (hyps, refs, srcs)):
            encoded = [t.encode("utf-8") for t in texts]
            data = torch.frombuffer(bytearray(b"".join(encoded)), dtype=torch.uint8) if any(encoded) else torch.zeros(0)
            getattr(self, f"{name}_bytes").append(data.to(self.device, torch.float32))
            getattr(self, f"{name}_lengths").append(torch.tensor([len(b) for b in encoded], dtype=torch.float32,
                                                                 device=self.device))
        self.index.append(torch.as_tensor(index, dtype=torch.float32, device=self.device).flatten())

    def compute(self) -> dict[str, Tensor]:
        index = _cat(self.index).long().tolist()
        texts = {name: self._decode(name) for name in TEXTS}
        first = {}
        for position, i in enumerate(index):
            first.setdefault(i, position)  # a padded sampler's repeats keep their first copy
        order = [first[i] for i in sorted(first)]
        self.corpus = {name: [values[p] for p in order] for name, values in texts.items()}
        if not order:
            return {"bleu": torch.tensor(0.0, dtype=torch.float64), "chrf": torch.tensor(0.0, dtype=torch.float64)}
        bleu, chrf = BLEU(), CHRF()
        refs = [self.corpus["ref"]]
        scores = {"bleu": bleu.corpus_score(self.corpus["hyp"], refs).score,
                  "chrf": chrf.corpus_score(self.corpus["hyp"], refs).score}
        self.signatures = {"bleu_signature": str(bleu.get_signature()),
                           "chrf_signature": str(chrf.get_signature()),
                           "data_signature": data_signature(self.corpus["src"], self.corpus["ref"])}
        return {name: torch.tensor(value, dtype=torch.float64) for name, value in scores.items()}  # exact

    def _decode(self, name: str) -> list[str]:
        data = _cat(getattr(self, f"{name}_bytes")).to("cpu", torch.uint8).numpy().tobytes()
        lengths = _cat(getattr(self, f"{name}_lengths")).long().tolist()
        out, start = [], 0
        for n in lengths:
            out.append(data[start: start + n].decode("utf-8"))
            start += n
        return out


def data_signature(sources: Sequence[str], references: Sequence[str]) -> str:
    """Which sentences were scored: BLEU of two runs compares only if they scored the same ones
    (the gettext corpus comes from the machine's catalogs, so another machine can build another)."""
    digest = hashlib.sha256()
    for src, ref in zip(sources, references):
        digest.update(f"{src}\t{ref}\n".encode("utf-8"))
    return f"sentences:{len(sources)}|sha256:{digest.hexdigest()[:12]}"


def _cat(state: list[Tensor] | Tensor) -> Tensor:
    """A "cat" state as one tensor: a list before syncing, a tensor after, empty if never updated."""
    if isinstance(state, list):
        return dim_zero_cat(state) if state else torch.zeros(0)
    return state


class CorpusEvaluation(Evaluation):
    """An Evaluation whose result also carries the sacrebleu signatures and the split's text.

    `details()`, asked at compute time, adds to the result's own (e.g. the training data's
    signature: two runs scored on the same test set can still have learned from different data).
    """

    def __init__(self, metrics, buckets=None, details: Callable[[], dict[str, str]] | None = None):
        super().__init__(metrics, buckets)
        self.details = details

    def compute(self) -> EvalResult:
        result = super().compute()
        score = next(m for m in self.metrics.values() if isinstance(m, CorpusScore))
        extra = self.details() if self.details else {}
        return result._replace(details={**score.signatures, **extra}, outputs=dict(score.corpus))
