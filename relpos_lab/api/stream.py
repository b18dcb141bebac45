"""Streamed training data: a fresh example at every step, as Delétang et al. and Ruoss et al. train.

A `Stream` is a training split without a fixed set of examples: example i is drawn on demand
from a generator seeded by (seed, i) alone. The data module serves optimizer step s the indices
s·G … s·G + G − 1 (G the global batch: `data.batch_size` × processes), each rank its own slice of
them, in order. So the stream is:

- reproducible: the same seed gives the same examples at the same steps;
- resumable: a checkpoint at step s resumes with step s's examples (the loader skips the steps
  done, without drawing them), and a longer budget continues the same stream;
- exact under DDP: n processes of batch B see at each step the examples one process of batch n·B
  sees.

With `length_per_batch` every example of a step has one length, drawn from (seed, step), as the
reference's training loop draws one length per batch; otherwise each example draws its own.
"""
from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import Dataset, Sampler


def seed_of(*parts: object) -> int:
    """A generator seed from its parts, independent of Python's hash randomization and global RNG state."""
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:8], "little")


class Stream(Dataset):
    """Training examples drawn on demand: `draw(length, rng)` with a length uniform in `lengths`."""

    def __init__(self, draw: Callable[[int, random.Random], Any], lengths: tuple[int, int], seed: int,
                 length_per_batch: bool = False):
        self.draw, self.lengths, self.seed, self.length_per_batch = draw, lengths, seed, length_per_batch
        self.per_step = 1  # examples per optimizer step over all ranks: the data module sets it

    def length_of(self, index: int, rng: random.Random) -> int:
        if self.length_per_batch:
            rng = random.Random(seed_of(self.seed, "length", index // self.per_step))
        return rng.randint(*self.lengths)

    def __getitem__(self, index: int) -> Any:
        rng = random.Random(seed_of(self.seed, index))
        return self.draw(self.length_of(index, rng), rng)


class StreamBatches(Sampler[list[int]]):
    """One rank's batches of a stream: at step s, rank r of `world` takes indices (s·world + r)·B …
    + B − 1, so the ranks' batches together are the step's global batch, in rank order."""

    def __init__(self, batch_size: int, steps: int, world: int = 1, rank: int = 0):
        self.batch_size, self.steps, self.world, self.rank = batch_size, steps, world, rank

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.steps):
            start = (step * self.world + self.rank) * self.batch_size
            yield list(range(start, start + self.batch_size))

    def __len__(self) -> int:
        return self.steps
