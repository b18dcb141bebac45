"""Multi-digit decimal addition, the length-generalization probe of Zhou et al. (2024,
"Transformers Can Achieve Length Generalization But Not Robustly") and the papers before it.

The source is two decimal numbers around "+", most significant digit first; the target their sum,
most significant digit first or, with `reversed_output`, least significant first (the order in
which the carry is computed). With `index_hints` every digit, of the operands and of the sum, is
preceded by a symbol naming its place value ("p0" the units, "p1" the tens, ...), so the digits to
add are marked alike (Zhou et al.'s index hints; they draw the hint letters from a fixed alphabet,
which we replace by one symbol per place value up to `max_digits`). Hints of the places beyond the
training lengths are never seen in training, as in the paper.

A length is a number of digits: a training example's operands take lengths uniform in
`train_lengths`, independently, and is bucketed by the longer one; a valid/test example at length
n adds two n-digit numbers. Numbers of 2 or more digits have no leading zero. The metric is exact
match per length (results.json `by_length`), as in the paper. How the paper draws the operand
lengths and its hint alphabet could not be confirmed from its text here: those two are our choice.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from relpos_lab.api import ConfigError, ModelConfig, Pair, Vocabulary
from relpos_lab_tasks.synthetic import LengthsConfig, LengthsTask, split_seed


@dataclass
class AdditionConfig(LengthsConfig):
    reversed_output: bool = False
    """write the sum least significant digit first (Zhou et al.'s reversed format)"""
    index_hints: bool = False
    """precede every digit by a symbol naming its place value (Zhou et al.'s index hints)"""
    max_digits: int = 128
    """index hints: symbols for places 0 .. max_digits (part of the vocabulary: keep it fixed
    between training and evaluation); at least one more than the longest operand"""

    def validate(self) -> None:
        super().validate()
        longest = max(hi for _, hi in (self.train_lengths, self.valid_lengths, self.test_lengths))
        if self.index_hints and longest >= self.max_digits:
            raise ValueError(f"task.max_digits={self.max_digits} must exceed the longest operand ({longest} digits) "
                             "with task.index_hints=true: the sum's carry digit needs a hint too")


class AdditionTask(LengthsTask):
    """Add two decimal numbers of 1-N digits; reversed output and index hints as options (Zhou et al. 2024)."""

    config_class = AdditionConfig
    cfg: AdditionConfig

    def build_model(self, cfg: ModelConfig):
        """Refuses a scheme that places digits by their runs (abacus, position coupling) where the
        format breaks its rule: index hints split every number into one-digit runs, and a sum written
        most significant digit first has places unknown until it ends."""
        if getattr(type(cfg.positions).scheme_class, "reads_tokens", False):
            name = f"model.positions.scheme={cfg.positions.scheme}"
            if self.cfg.index_hints:
                raise ConfigError(f"{name} finds numbers as runs of digits, and task.index_hints=true puts a hint "
                                  "between every two digits; set task.index_hints=false (the scheme marks the places)")
            if getattr(cfg.positions, "counts_significance", False) and not self.cfg.reversed_output:
                raise ConfigError(f"{name} places the sum's digits by significance, which is unknown while the sum "
                                  "is written most significant digit first; set task.reversed_output=true"
                                  + (" (or model.positions.order=written)" if cfg.positions.scheme == "abacus" else ""))
        return super().build_model(cfg)

    def build_vocab(self) -> Vocabulary:
        hints = [f"p{i}" for i in range(self.cfg.max_digits + 1)] if self.cfg.index_hints else []
        return Vocabulary([*(str(d) for d in range(10)), "+", *hints])

    def dataset(self, split: str) -> list[Pair]:
        if split == "train" and not self.cfg.train_size:
            return self.stream()  # refused: two operand lengths per example are not one length to draw
        lo, hi = self.lengths(split)
        rng = random.Random(split_seed(self.data_seed, split))
        if split == "train":
            shapes = [(rng.randint(lo, hi), rng.randint(lo, hi)) for _ in range(self.cfg.train_size)]
        else:
            shapes = [(n, n) for n in self.length_buckets(split) for _ in range(self.cfg.eval_size_per_length)]
        pairs = []
        for n, m in shapes:
            a, b = number(n, rng), number(m, rng)
            src = self.encode(self.digits(a)) + ["+"] + self.encode(self.digits(b))
            tgt = self.encode(self.digits(a + b), reverse=self.cfg.reversed_output)
            pairs.append(Pair(torch.tensor(self.vocab.encode(src)), torch.tensor(self.vocab.encode(tgt))))
        return pairs

    @staticmethod
    def digits(x: int) -> list[str]:
        return list(str(x))

    def encode(self, digits: list[str], reverse: bool = False) -> list[str]:
        """Digits (most significant first) as symbols: reversed, and each after its place's hint."""
        places = list(range(len(digits) - 1, -1, -1))
        if reverse:
            digits, places = digits[::-1], places[::-1]
        if not self.cfg.index_hints:
            return digits
        return [s for place, d in zip(places, digits) for s in (f"p{place}", d)]

    def example_length(self, example: Pair) -> int:
        """The longer operand's number of digits."""
        first = self.vocab.index["0"]
        plus = self.vocab.index["+"]
        src = example.src.tolist()
        cut = src.index(plus)
        is_digit = [first <= t < first + 10 for t in src]
        return max(sum(is_digit[:cut]), sum(is_digit[cut + 1:]))


def number(n_digits: int, rng: random.Random) -> int:
    """Uniform over the numbers of exactly n digits (0-9 for one digit: no leading zero otherwise)."""
    return rng.randint(0 if n_digits == 1 else 10 ** (n_digits - 1), 10**n_digits - 1)
