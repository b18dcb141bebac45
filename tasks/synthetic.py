"""Copy and reverse: algorithmic sequence-to-sequence tasks for probing position schemes.

The source is a random string over a small alphabet; the target is the same string (copy) or the
string reversed (reverse). Reversing needs to know where each token sits relative to the end,
which is what position representations provide; evaluating on lengths longer than any seen in
training asks whether they generalise (Shaw et al. argue clipped relative positions do).

Data is generated from the seed, never read from files: the same config always yields the same
examples. Valid and test hold the same number of examples for every length, so the per-length
accuracies in results.json (`by_length`) are equally precise.

This module uses only the public plugin API (relpos_lab.task), as a third-party task would; it is
registered through the ``relpos_lab.tasks`` entry points in pyproject.toml.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch
from torch import Tensor

from relpos_lab.task import Pair, Task, TaskConfig, Vocabulary


@dataclass
class SyntheticConfig(TaskConfig):
    alphabet_size: int = 10  # symbols "0", "1", ..., excluding the specials
    train_lengths: list[int] = field(default_factory=lambda: [1, 16])  # inclusive [min, max]
    valid_lengths: list[int] = field(default_factory=lambda: [1, 16])
    test_lengths: list[int] = field(default_factory=lambda: [1, 32])  # may exceed training
    train_size: int = 20000  # training examples, lengths drawn uniformly from train_lengths
    eval_size_per_length: int = 32  # valid/test examples for each length of their range
    data_seed: int | None = None  # None: the experiment's seed

    def validate(self) -> None:
        super().validate()
        if self.alphabet_size < 2:
            raise ValueError(f"task.alphabet_size={self.alphabet_size} must be >= 2")
        for name in ("train_lengths", "valid_lengths", "test_lengths"):
            value = list(getattr(self, name))
            if len(value) != 2 or not 1 <= value[0] <= value[1]:
                raise ValueError(f"task.{name}={value} must be [min, max] with 1 <= min <= max")
        for name in ("train_size", "eval_size_per_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"task.{name}={getattr(self, name)} must be >= 1")


class SyntheticTask(Task):
    """A string task whose target is a fixed function (`transform`) of its source."""

    config_class = SyntheticConfig
    cfg: SyntheticConfig

    def transform(self, src: Tensor) -> Tensor:
        raise NotImplementedError

    def build_vocab(self) -> Vocabulary:
        return Vocabulary(str(i) for i in range(self.cfg.alphabet_size))

    def lengths(self, split: str) -> tuple[int, int]:
        self.check_split(split)
        lo, hi = getattr(self.cfg, f"{split}_lengths")
        return int(lo), int(hi)

    def dataset(self, split: str) -> list[Pair]:
        lo, hi = self.lengths(split)
        gen = torch.Generator().manual_seed(_split_seed(self.data_seed, split))
        if split == "train":
            lengths = torch.randint(lo, hi + 1, (self.cfg.train_size,), generator=gen)
        else:
            lengths = torch.arange(lo, hi + 1).repeat_interleave(self.cfg.eval_size_per_length)
        first = len(Vocabulary.SPECIALS)
        tokens = torch.randint(first, first + self.cfg.alphabet_size, (len(lengths), hi), generator=gen)
        return [Pair(row[:n].clone(), self.transform(row[:n])) for row, n in zip(tokens, lengths.tolist())]

    @property
    def data_seed(self) -> int:
        return self.seed if self.cfg.data_seed is None else self.cfg.data_seed

    def length_buckets(self, split: str) -> list[int]:
        lo, hi = self.lengths(split)
        return list(range(lo, hi + 1))

    def train_length_range(self) -> tuple[int, int]:
        return self.lengths("train")


class CopyTask(SyntheticTask):
    """Copy a random string of symbols."""

    def transform(self, src: Tensor) -> Tensor:
        return src.clone()


class ReverseTask(SyntheticTask):
    """Reverse a random string of symbols."""

    def transform(self, src: Tensor) -> Tensor:
        return src.flip(0)


def _split_seed(seed: int, split: str) -> int:
    """A generator seed per (seed, split): splits differ, and nothing depends on global RNG state."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{split}".encode()).digest()[:8], "little")
