"""What the tasks of Delétang et al. (2023) share: per-length generation and the paper's score.

Each task draws one example of a given length from a `random.Random` (`sample`), as symbol
indices into its input and output alphabets, exactly as the paper's generators do (their degenerate
cases at lengths 1-2 included; each task's docstring says what they are). The length is the
paper's: the input length, except where a task's `source_length` says otherwise (the simple
modular arithmetic makes even lengths odd). Training lengths are drawn uniformly from
`train_lengths` (the paper's uniform curriculum); valid and test hold `eval_size_per_length`
examples of every length, so `test/accuracy_ood` is the paper's score: the accuracy at each test
length, averaged over the lengths.

The paper's accuracy is per token over the positions it scores: every output token, and for the
tasks whose output ends in a termination token (stack manipulation, binary addition and
multiplication) that token too, which is our EOS (`scores_eos`). A one-token output
(classification) is then the share of correct answers. `exact_match` and `token_accuracy` (EOS
always included) are reported beside it.

The paper's model reads the input followed by blank positions and writes the output at them, one
per token of the reference's `output_length` (its tasks with a termination token pad their output
to that length): `model.architecture=encoder_only` here, with the slot counts of `output_length`.
The other families decode the output (encoder-decoder or prefix LM), so the end of the output is
predicted too; an output that stops early or runs on is wrong from there.
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar

import torch
from torch import Tensor
from torchmetrics import Metric, MetricCollection

from relpos_lab.api import DecodingConfig, Pair, Vocabulary
from relpos_lab.api.stream import Stream
from relpos_lab_tasks.synthetic import ODDS_FIRST_ORDERS, LengthsConfig, LengthsTask, split_seed


@dataclass
class ChomskyConfig(LengthsConfig):
    """One config for every task of the suite, so that an experiment keeps its lengths and sizes
    when `task.name` switches between them (a sweep over the tasks relies on it); a field that
    only some tasks read says which."""

    modulus: int = 5
    """modular_arithmetic, modular_arithmetic_brackets, solve_equation: the numbers are
    0 .. modulus-1 and the answer is taken modulo it (the paper: 5)"""
    multiplication: bool = True
    """modular_arithmetic_brackets: use * besides + and - (the paper's runs do: its task table,
    experiments/constants.py, sets mult=True, where the generator class's own default is False)"""
    order: str = "paper"
    """odds_first_string: paper: the 1st, 3rd, ... symbols first (s[0::2] + s[1::2], the paper's text and
    its code's docstring); code: the 2nd, 4th, ... first (s[1::2] + s[0::2], what the published code computes)"""
    vocab_size: int = 0
    """reverse_string, duplicate_string, odds_first_string, bucket_sort: the strings' symbols
    "0" .. vocab_size-1; 0: the paper's (2; bucket_sort 5)"""
    decoding: DecodingConfig = field(default_factory=lambda: DecodingConfig(max_len_a=2.0))
    """The longest outputs (duplicate_string) are twice the input: the output budget is 2·|source| + 10."""

    def validate(self) -> None:
        super().validate()
        if not 2 <= self.modulus <= 10:
            raise ValueError(f"task.modulus={self.modulus} must be in 2..10 (one digit per number)")
        if self.vocab_size not in (0, *range(2, 11)):
            raise ValueError(f"task.vocab_size={self.vocab_size} must be 0 (the paper's) or 2..10")
        if self.order not in ODDS_FIRST_ORDERS:
            raise ValueError(f"task.order={self.order!r}; choose one of {', '.join(ODDS_FIRST_ORDERS)}")


class ChomskyTask(LengthsTask):
    """A task of Delétang et al. (2023): `sample` draws one example of a length."""

    config_class = ChomskyConfig
    main_metric = "accuracy"
    scores_eos: ClassVar[bool] = False  # the output ends in the paper's termination token (our EOS)
    input_symbols: ClassVar[Sequence[str]] = ()
    output_symbols: ClassVar[Sequence[str]] = ()

    def sample(self, length: int, rng: random.Random) -> tuple[list[int], list[int]]:
        """One example of `length`: (input, output) as indices into the input and output symbols."""
        raise NotImplementedError

    def output_of(self, source: list[int]) -> list[int]:
        """The output of an input, symbol indices in and out: the task's definition, computed from
        the input alone. Without the paper's termination token (our EOS stands for it). `sample`
        uses it where that leaves its random draws as they were; where `sample` knows the answer by
        construction (solve equation, missing duplicate), tests/test_chomsky.py checks that the two
        agree, and tests/test_golden.py holds it against the reference generators' outputs."""
        raise NotImplementedError

    def source_length(self, length: int) -> int:
        """The input length of an example of the paper's `length` (the two differ for one task)."""
        return length

    def output_length(self, source_length: int) -> int:
        """The reference's `output_length`: the encoder-only model's output slots (one: a class)."""
        return 1

    # --- vocabulary: the paper's input and output alphabets, one vocabulary when they are equal --

    def inputs(self) -> Sequence[str]:
        return self.input_symbols

    def outputs(self) -> Sequence[str]:
        return self.output_symbols

    def build_vocab(self) -> Vocabulary:
        return Vocabulary(self.inputs())

    @property
    def src_vocab(self) -> Vocabulary:
        return self.vocab

    @cached_property
    def tgt_vocab(self) -> Vocabulary:
        return self.vocab if list(self.outputs()) == list(self.inputs()) else Vocabulary(self.outputs())

    # --- data ---------------------------------------------------------------------------------

    def nominal_lengths(self, split: str) -> list[int]:
        """The paper's lengths a valid/test split holds (every `eval_length_step`-th, and the longest)."""
        return super().length_buckets(split)

    def length_buckets(self, split: str) -> list[int]:
        return sorted({self.source_length(n) for n in self.nominal_lengths(split)})

    def example_of_length(self, length: int, rng: random.Random) -> Pair:
        """`sample` as token ids."""
        src, tgt = self.sample(length, rng)
        first = len(Vocabulary.SPECIALS)
        return Pair(torch.tensor(src, dtype=torch.long) + first, torch.tensor(tgt, dtype=torch.long) + first)

    def dataset(self, split: str) -> list[Pair] | Stream:
        if split == "train" and not self.cfg.train_size:
            return self.stream()
        lo, hi = self.lengths(split)
        rng = random.Random(split_seed(self.data_seed, split))
        if split == "train":
            lengths = [rng.randint(lo, hi) for _ in range(self.cfg.train_size)]
        else:
            lengths = [n for n in self.nominal_lengths(split) for _ in range(self.cfg.eval_size_per_length)]
        return [self.example_of_length(n, rng) for n in lengths]

    # --- the paper's score --------------------------------------------------------------------

    def build_metrics(self) -> MetricCollection:
        metrics = super().build_metrics()
        v = self.tgt_vocab
        metrics.add_metrics({"accuracy": ScoredAccuracy(v.pad_id, None if self.scores_eos else v.eos_id)})
        return metrics


class ScoredAccuracy(Metric):
    """Per-token accuracy over the reference positions that are neither pad nor `skip_id`: the
    paper's accuracy when `skip_id` is the EOS of an output without a termination token."""

    full_state_update = False

    def __init__(self, pad_id: int, skip_id: int | None):
        super().__init__()
        self.pad_id, self.skip_id = pad_id, skip_id
        self.add_state("correct", default=torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor) -> None:
        scored = target != self.pad_id
        if self.skip_id is not None:
            scored &= target != self.skip_id
        self.correct += ((preds == target) & scored).sum()
        self.total += scored.sum()

    def compute(self) -> Tensor:
        return self.correct / self.total.clamp_min(1)


def bits(rng: random.Random, n: int) -> list[int]:
    """n uniform binary digits."""
    return rng.choices((0, 1), k=n)
