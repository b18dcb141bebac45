"""The Task: what an experiment needs to know about one problem. This is the plugin API.

As in fairseq, a task is a small class with a typed config and a few verbs: build the vocabulary,
build a split's dataset, collate examples into a batch, build the model, score a batch for
training, and `evaluate` a batch. The framework (module.py, data.py, the CLI) only ever talks to a
task through these verbs, so a new problem is one module and one YAML file.

The defaults implement a sequence-to-sequence task over token ids (an encoder-decoder trained with
label smoothing, evaluated by decoding and comparing with the reference), so a typical task only
defines `build_vocab` and `dataset`. There is exactly one `evaluate`, used by validation during
training and by `relpos-lab eval`; that is what keeps the two from ever disagreeing.

Tasks are found through the ``relpos_lab.tasks`` entry-point group (registry.py), never by import
side effects.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar, NamedTuple

import torch
from omegaconf import MISSING
from torch import Tensor, nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassExactMatch

from .decoding import beam_search, greedy_search
from .errors import ConfigError, UserError, did_you_mean
from .evaluation import Evaluation
from .transformer import EncoderDecoder, LossOutput, ModelConfig, label_smoothed_loss

Batch = dict[str, Tensor]


@dataclass
class DecodingConfig:
    """How predictions are produced for evaluation: greedy when beam_size is 1."""

    beam_size: int = 1
    """hypotheses kept by beam search; 1: greedy"""
    length_penalty: float = 0.6
    """GNMT length penalty α of beam search"""
    max_len_a: float = 1.0
    """output budget a·|source| + b (fairseq's --max-len-a/b)"""
    max_len_b: int = 10
    """see max_len_a"""


@dataclass
class TaskConfig:
    """Base of every task's config; a task's own fields go in a subclass (`Task.config_class`)."""

    name: str = MISSING
    """the entry-point name that selects the task"""
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    """how evaluation decodes"""

    def validate(self) -> None:
        """Raise ValueError naming a bad field; subclasses extend it (call super().validate())."""
        if self.decoding.beam_size < 1:
            raise ValueError(f"task.decoding.beam_size={self.decoding.beam_size} must be >= 1")


class Pair(NamedTuple):
    """One example: source and target token ids, without BOS/EOS (collate adds them)."""

    src: Tensor
    tgt: Tensor


class Vocabulary:
    """Symbols and their ids; the four specials come first, so pad is 0 as ModelConfig expects."""

    SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")
    pad_id, bos_id, eos_id, unk_id = 0, 1, 2, 3

    def __init__(self, symbols: Iterable[str]):
        self.symbols = list(self.SPECIALS) + list(symbols)
        self.index = {s: i for i, s in enumerate(self.symbols)}
        if len(self.index) != len(self.symbols):
            raise ValueError("vocabulary symbols must be unique and must not repeat the specials")

    def __len__(self) -> int:
        return len(self.symbols)

    def encode(self, tokens: Iterable[str]) -> list[int]:
        return [self.index.get(t, self.unk_id) for t in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Symbols up to the first EOS, without pad and BOS."""
        out = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                break
            if i not in (self.pad_id, self.bos_id):
                out.append(self.symbols[i] if 0 <= i < len(self.symbols) else self.SPECIALS[3])
        return out


class Task:
    """Base class of task plugins. Subclasses set `config_class` and define `build_vocab` and
    `dataset`; everything else has a sequence-to-sequence default that may be overridden."""

    config_class: ClassVar[type[TaskConfig]] = TaskConfig
    main_metric: ClassVar[str] = "exact_match"  # picks the best checkpoint (on split "valid")
    main_metric_mode: ClassVar[str] = "max"
    splits: ClassVar[tuple[str, ...]] = ("train", "valid", "test")  # "valid" picks checkpoints

    def __init__(self, cfg: TaskConfig, *, seed: int = 0):
        self.cfg = cfg
        self.seed = seed

    @classmethod
    def describe(cls) -> str:
        """One line for `relpos-lab tasks`: the first line of the class docstring."""
        return (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""

    def check_split(self, split: str) -> None:
        if split not in self.splits:
            close = did_you_mean(split, list(self.splits))
            hint = f"did you mean '{close}'? " if close else ""
            raise UserError(f"task '{self.cfg.name}' has no split '{split}'; {hint}splits: {', '.join(self.splits)}")

    # --- what every task defines ------------------------------------------------------------

    def build_vocab(self) -> Vocabulary:
        raise NotImplementedError(f"{type(self).__name__} must define build_vocab()")

    def dataset(self, split: str) -> Dataset:
        """The examples (`Pair`s) of one split: "train", "valid", "test" or a task's own."""
        raise NotImplementedError(f"{type(self).__name__} must define dataset(split)")

    # --- vocabulary and data ----------------------------------------------------------------

    @cached_property
    def vocab(self) -> Vocabulary:
        return self.build_vocab()

    @property
    def src_vocab(self) -> Vocabulary:
        return self.vocab

    @property
    def tgt_vocab(self) -> Vocabulary:
        return self.vocab

    def prepare_data(self) -> None:
        """One-time work on one process (download, train a tokenizer); cache it on disk."""

    def max_tokens(self, split: str) -> int | None:
        """Bound the batches of `split` by padded tokens (fairseq's --max-tokens, see batching.py)
        instead of data.batch_size / eval_batch_size examples; None (the default) keeps the latter."""
        return None

    def num_tokens(self, example: Pair) -> int:
        """An example's size for token batching: its longer side once collated (target + EOS)."""
        return max(len(example.src), len(example.tgt) + 1)

    def example_length(self, example: Pair) -> int:
        """The length an example is bucketed by: its source length."""
        return len(example.src)

    def length_buckets(self, split: str) -> Sequence[int] | None:
        """Bucket keys reported in results.json `by_length` for `split`; None: no per-length view."""
        return None

    def bucket_of(self, lengths: Tensor) -> Tensor:
        """Map example lengths to bucket keys (identity: one bucket per length)."""
        return lengths

    def train_length_range(self) -> tuple[int, int] | None:
        """Lengths seen in training (inclusive), shaded in per-length plots."""
        return None

    def collate(self, examples: Sequence[Pair]) -> Batch:
        """Pad a list of pairs into src, tgt_in (BOS + target), tgt_out (target + EOS), length."""
        src_v, tgt_v = self.src_vocab, self.tgt_vocab
        bos, eos = torch.tensor([tgt_v.bos_id]), torch.tensor([tgt_v.eos_id])
        src = [torch.as_tensor(e.src, dtype=torch.long) for e in examples]
        tgt = [torch.as_tensor(e.tgt, dtype=torch.long) for e in examples]
        return {
            "src": pad_sequence(src, batch_first=True, padding_value=src_v.pad_id),
            "tgt_in": pad_sequence([torch.cat((bos, t)) for t in tgt], batch_first=True, padding_value=tgt_v.pad_id),
            "tgt_out": pad_sequence([torch.cat((t, eos)) for t in tgt], batch_first=True, padding_value=tgt_v.pad_id),
            "length": torch.tensor([self.example_length(e) for e in examples], dtype=torch.long),
        }

    # --- raw text in and out (`relpos-lab translate`) and what a checkpoint must carry ----------

    def encode_input(self, line: str) -> Tensor:
        """Source ids of one line of user input: whitespace-separated symbols by default."""
        return torch.tensor(self.src_vocab.encode(line.split()), dtype=torch.long)

    def decode_output(self, ids: Tensor) -> str:
        """The text of predicted target ids (up to EOS): symbols joined by spaces by default."""
        return " ".join(self.tgt_vocab.decode(ids))

    def state_dict(self) -> dict:
        """What the task learned from its data (say, a subword model) and a checkpoint must carry
        so that it alone rebuilds the task; stored under "task_state". Default: nothing."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict()` from a checkpoint, before the vocabulary is first used."""

    # --- model and training -----------------------------------------------------------------

    def build_model(self, cfg: ModelConfig) -> nn.Module:
        """The core encoder-decoder, with vocabulary sizes and pad id taken from the task."""
        sizes = {"src_vocab_size": len(self.src_vocab), "tgt_vocab_size": len(self.tgt_vocab)}
        for key, size in sizes.items():
            if getattr(cfg, key) not in (0, size):
                raise ConfigError(
                    f"model.{key}={getattr(cfg, key)} but task '{self.cfg.name}' has a vocabulary of "
                    f"{size} symbols; leave it 0 to take the task's size"
                )
        if self.src_vocab.pad_id != self.tgt_vocab.pad_id:
            raise ValueError("source and target vocabularies must share the pad id")
        return EncoderDecoder(dataclasses.replace(cfg, **sizes, pad_id=self.tgt_vocab.pad_id))

    def loss(self, model: nn.Module, batch: Batch, label_smoothing: float) -> LossOutput:
        """The training objective of one batch: label-smoothed cross-entropy under teacher forcing."""
        logits = model(batch["src"], batch["tgt_in"])
        return label_smoothed_loss(logits, batch["tgt_out"], smoothing=label_smoothing,
                                   ignore_index=self.tgt_vocab.pad_id)

    # --- evaluation -------------------------------------------------------------------------

    def build_metrics(self) -> MetricCollection:
        """Metrics of (predictions, reference) token tensors, both (B, T), pad where unused.

        token_accuracy: share of reference tokens (EOS included) predicted at their position;
        exact_match: share of examples whose prediction equals the reference, EOS included.
        """
        n, pad = len(self.tgt_vocab), self.tgt_vocab.pad_id
        return MetricCollection({
            "token_accuracy": MulticlassAccuracy(num_classes=n, average="micro", ignore_index=pad),
            "exact_match": MulticlassExactMatch(num_classes=n, ignore_index=pad),
        })

    def build_evaluation(self, split: str) -> Evaluation:
        return Evaluation(self.build_metrics(), self.length_buckets(split))

    def decode(self, model: nn.Module, batch: Batch) -> Tensor:
        """Predicted target ids (B, T'), EOS included and pad after it, per `cfg.decoding`."""
        d, v = self.cfg.decoding, self.tgt_vocab
        kwargs = dict(bos_id=v.bos_id, eos_id=v.eos_id, pad_id=v.pad_id,
                      max_len_a=d.max_len_a, max_len_b=d.max_len_b)
        if d.beam_size > 1:
            return beam_search(model, batch["src"], beam_size=d.beam_size,
                               length_penalty=d.length_penalty, **kwargs)
        return greedy_search(model, batch["src"], **kwargs)

    def evaluate(self, model: nn.Module, batch: Batch, evaluation: Evaluation) -> Tensor:
        """Score one batch into `evaluation` and return the predictions (for sample tables).

        The one evaluation of the framework: validation, test and `relpos-lab eval` all call it.
        """
        pad = self.tgt_vocab.pad_id
        forced = label_smoothed_loss(model(batch["src"], batch["tgt_in"]), batch["tgt_out"],
                                     smoothing=0.0, ignore_index=pad)
        evaluation.update_nll(forced.nll_sum, forced.n_tokens)
        hyps = self.decode(model, batch)
        target = batch["tgt_out"]
        evaluation.update(align(hyps, target.shape[1], pad), target, lengths=self.bucket_of(batch["length"]))
        return hyps

    def sample_rows(self, batch: Batch, hyps: Tensor, n: int = 8) -> tuple[list[str], list[list]]:
        """(columns, rows) of a few predictions, as text, for the W&B samples table."""
        src_v, tgt_v = self.src_vocab, self.tgt_vocab
        rows = []
        for i in range(min(n, hyps.shape[0])):
            target, prediction = tgt_v.decode(batch["tgt_out"][i]), tgt_v.decode(hyps[i])
            rows.append([" ".join(src_v.decode(batch["src"][i])), " ".join(target),
                         " ".join(prediction), target == prediction])
        return ["source", "target", "prediction", "correct"], rows


def align(hyps: Tensor, width: int, pad_id: int) -> Tensor:
    """Cut or pad predictions to the reference width, so they compare position by position.

    A prediction longer than its reference cannot match: the reference's EOS position then holds
    a non-EOS token. A shorter one puts EOS (or pad) where the reference has a token.
    """
    if hyps.shape[1] >= width:
        return hyps[:, :width]
    return torch.nn.functional.pad(hyps, (0, width - hyps.shape[1]), value=pad_id)
