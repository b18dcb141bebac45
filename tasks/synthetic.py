"""Algorithmic sequence-to-sequence tasks for probing position schemes.

The source is a random string over a small alphabet; the target is the same string (copy), the
string reversed (reverse), written twice (duplicate), sorted (sort), or its odd-position symbols
followed by its even-position ones (odds_first) — the string tasks of Delétang et al. (2023) and
Ontañón et al. (2022) that need no arithmetic carry. Reversing needs to know where each token sits relative to the end,
which is what position representations provide; evaluating on lengths longer than any seen in
training asks whether they generalise (Shaw et al. argue clipped relative positions do).

Data is generated from the seed, never read from files: the same config always yields the same
examples. Valid and test hold the same number of examples for every length, so the per-length
accuracies in results.json (`by_length`) are equally precise.

This module uses only the public plugin API (relpos_lab.api.task), as a third-party task would; it is
registered through the ``relpos_lab.tasks`` entry points in pyproject.toml.
"""
from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass, field

import torch
from torch import Tensor

from relpos_lab.api import ConfigError, DecodingConfig, Pair, Seq2SeqTask, TaskConfig, Vocabulary
from relpos_lab.api.stream import Stream, seed_of

DEBUG_LENGTHS, DEBUG_PER_LENGTH, DEBUG_TRAIN = 8, 16, 2000  # the `debug` overlay's data (LengthsConfig.for_debug)


@dataclass
class LengthsConfig(TaskConfig):
    """What every length probe sets: the length ranges of its splits, their sizes, the data seed."""

    train_lengths: list[int] = field(default_factory=lambda: [1, 16])
    """inclusive [min, max] of training strings"""
    valid_lengths: list[int] = field(default_factory=lambda: [1, 16])
    """inclusive [min, max] of validation"""
    test_lengths: list[int] = field(default_factory=lambda: [1, 32])
    """inclusive [min, max] of test strings; may exceed training (length generalization)"""
    train_size: int = 20000
    """training examples, lengths drawn uniformly from train_lengths; 0: a fresh stream of examples at every
    step, drawn from (seed, step) (reproducible, resumable, the same under DDP as on one process)"""
    length_per_batch: bool = False
    """streamed data (train_size=0): every example of a step has one length, as the reference draws them"""
    eval_size_per_length: int = 32
    """valid/test examples for each length of their range"""
    eval_length_step: int = 1
    """evaluate every n-th length of the valid/test ranges (long probes)"""
    data_seed: int | None = None
    """None: the experiment's seed"""

    def for_debug(self) -> LengthsConfig:
        """At most DEBUG_LENGTHS + 1 lengths of each evaluated range (its ends and a few between),
        DEBUG_PER_LENGTH examples of each, DEBUG_TRAIN training examples (a stream stays a stream)."""
        spans = [hi - lo for lo, hi in (self.valid_lengths, self.test_lengths)]
        step = max(self.eval_length_step, *(math.ceil(span / (DEBUG_LENGTHS - 1)) for span in spans))
        return dataclasses.replace(self, eval_length_step=step,
                                   eval_size_per_length=min(self.eval_size_per_length, DEBUG_PER_LENGTH),
                                   train_size=min(self.train_size, DEBUG_TRAIN))

    def validate(self) -> None:
        super().validate()
        for name in ("train_lengths", "valid_lengths", "test_lengths"):
            value = list(getattr(self, name))
            if len(value) != 2 or not 1 <= value[0] <= value[1]:
                raise ValueError(f"task.{name}={value} must be [min, max] with 1 <= min <= max")
        for name in ("eval_size_per_length", "eval_length_step"):
            if getattr(self, name) < 1:
                raise ValueError(f"task.{name}={getattr(self, name)} must be >= 1")
        if self.train_size < 0:
            raise ValueError(f"task.train_size={self.train_size} must be >= 1, or 0 to stream fresh examples")
        if self.length_per_batch and self.train_size:
            raise ValueError(f"task.length_per_batch=true draws one length per step of a stream: set task.train_size=0 "
                             f"(now {self.train_size}) or drop it")


@dataclass
class SyntheticConfig(LengthsConfig):
    alphabet_size: int = 10
    """symbols "0", "1", ..., excluding the specials"""

    def validate(self) -> None:
        if self.alphabet_size < 2:
            raise ValueError(f"task.alphabet_size={self.alphabet_size} must be >= 2")
        super().validate()


class LengthsTask(Seq2SeqTask):
    """A task whose splits are lengths: one bucket per length in results.json's `by_length`."""

    config_class = LengthsConfig
    cfg: LengthsConfig

    def lengths(self, split: str) -> tuple[int, int]:
        self.check_split(split)
        lo, hi = getattr(self.cfg, f"{split}_lengths")
        return int(lo), int(hi)

    @property
    def data_seed(self) -> int:
        return self.seed if self.cfg.data_seed is None else self.cfg.data_seed

    def length_buckets(self, split: str) -> list[int]:
        lo, hi = self.lengths(split)
        step = 1 if split == "train" else self.cfg.eval_length_step
        return sorted(set(range(lo, hi + 1, step)) | {hi})

    def train_length_range(self) -> tuple[int, int]:
        return self.lengths("train")

    def example_of_length(self, length: int, rng: random.Random) -> Pair:
        """One example of `length` drawn from `rng`: what a streamed training split (train_size=0) is made
        of. A task that defines it can stream."""
        raise NotImplementedError

    def stream(self) -> Stream:
        """The training split as a stream (train_size=0): fresh examples from (data seed, index)."""
        if type(self).example_of_length is LengthsTask.example_of_length:
            raise ConfigError(f"task.train_size=0 streams fresh training examples, and task '{self.cfg.name}' draws "
                              "no single example (it defines no example_of_length); give task.train_size > 0")
        return Stream(self.example_of_length, self.lengths("train"), split_seed(self.data_seed, "train"),
                      self.cfg.length_per_batch)


class SyntheticTask(LengthsTask):
    """A string task whose target is a fixed function (`transform`) of its source."""

    config_class = SyntheticConfig
    cfg: SyntheticConfig

    def transform(self, src: Tensor) -> Tensor:
        raise NotImplementedError

    def output_length(self, source_length: int) -> int:
        """The target's length (encoder_only's slots): a permutation keeps the source's."""
        return source_length

    def build_vocab(self) -> Vocabulary:
        return Vocabulary(str(i) for i in range(self.cfg.alphabet_size))

    def example_of_length(self, length: int, rng: random.Random) -> Pair:
        first = len(Vocabulary.SPECIALS)
        src = torch.tensor([rng.randrange(first, first + self.cfg.alphabet_size) for _ in range(length)])
        return Pair(src, self.transform(src))

    def dataset(self, split: str) -> list[Pair] | Stream:
        if split == "train" and not self.cfg.train_size:
            return self.stream()
        lo, hi = self.lengths(split)
        gen = torch.Generator().manual_seed(split_seed(self.data_seed, split))
        if split == "train":
            lengths = torch.randint(lo, hi + 1, (self.cfg.train_size,), generator=gen)
        else:
            lengths = torch.tensor(self.length_buckets(split)).repeat_interleave(self.cfg.eval_size_per_length)
        first = len(Vocabulary.SPECIALS)
        tokens = torch.randint(first, first + self.cfg.alphabet_size, (len(lengths), hi), generator=gen)
        return [Pair(row[:n].clone(), self.transform(row[:n])) for row, n in zip(tokens, lengths.tolist())]


class CopyTask(SyntheticTask):
    """Copy a random string of symbols."""

    def transform(self, src: Tensor) -> Tensor:
        return src.clone()


class ReverseTask(SyntheticTask):
    """Reverse a random string of symbols."""

    def transform(self, src: Tensor) -> Tensor:
        return src.flip(0)


@dataclass
class DuplicateConfig(SyntheticConfig):
    decoding: DecodingConfig = field(default_factory=lambda: DecodingConfig(max_len_a=2.0))
    """Targets are twice as long as sources: the output budget is 2·|source| + 10."""


class DuplicateTask(SyntheticTask):
    """Write a random string twice (Delétang et al.'s duplicate_string)."""

    config_class = DuplicateConfig

    def transform(self, src: Tensor) -> Tensor:
        return torch.cat((src, src))

    def output_length(self, source_length: int) -> int:
        return 2 * source_length


class SortTask(SyntheticTask):
    """Sort the symbols of a random string (Delétang et al.'s bucket_sort)."""

    def transform(self, src: Tensor) -> Tensor:
        return src.sort().values


ODDS_FIRST_ORDERS = ("paper", "code")


@dataclass
class OddsFirstConfig(SyntheticConfig):
    order: str = "paper"
    """paper: the 1st, 3rd, ... symbols first (s[0::2] + s[1::2], Delétang et al.'s text and their code's
    docstring); code: the 2nd, 4th, ... first (s[1::2] + s[0::2], what their published code computes)"""

    def validate(self) -> None:
        super().validate()
        if self.order not in ODDS_FIRST_ORDERS:
            raise ValueError(f"task.order={self.order!r}; choose one of {', '.join(ODDS_FIRST_ORDERS)}")


class OddsFirstTask(SyntheticTask):
    """Symbols at odd positions (1st, 3rd, ...), then those at even positions (Delétang et al.)."""

    config_class = OddsFirstConfig
    cfg: OddsFirstConfig

    def transform(self, src: Tensor) -> Tensor:
        if self.cfg.order == "code":
            return torch.cat((src[1::2], src[0::2]))
        return torch.cat((src[0::2], src[1::2]))


def split_seed(seed: int, split: str) -> int:
    """A generator seed per (seed, split): splits differ, and nothing depends on global RNG state."""
    return seed_of(seed, split)
