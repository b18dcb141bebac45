"""Batches bounded by tokens rather than examples (fairseq's ``--max-tokens``).

Sentences in a corpus vary tenfold in length. A fixed number of examples per batch then wastes
most of each batch on padding and makes a step's memory depend on its longest sentence; bounding
the *padded* size instead (examples × longest example) keeps every step about equally expensive.
Examples are grouped with others of similar length, and the groups are shuffled, as fairseq does:
sort the epoch's random order by length (a stable sort, so equal lengths stay randomly ordered),
cut the sorted list greedily into batches, then put the batches in random order.

The epoch's order comes from an ordinary index sampler (`sampler`): a shuffling one for training,
a sequential one for evaluation. It must give every process the same order; Lightning calls its
``set_epoch`` (as ``batch_sampler.sampler``) at each epoch, which is what reshuffles. The batch
order is drawn from that same order, so there is no second random generator to keep in step.

Under DDP every process computes the same global list of batches and takes every
``num_replicas``-th one, as fairseq's sharded iterator does — token batches differ in example
count, so sharding examples first (DistributedSampler) would give processes different numbers of
batches and hang the gradient all-reduce. With ``even=True`` the list is padded with its first
batches to a multiple of ``num_replicas`` (every process steps the same number of times, needed
while training); with ``even=False`` nothing repeats and processes may differ by one batch (exact
evaluation, where no collective runs per batch).
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import Sampler


class TokenBatchSampler(Sampler[list[int]]):
    """Batches of example indices whose padded size, len(batch) × max(sizes), is ≤ max_tokens.

    An example larger than `max_tokens` on its own becomes a batch of one rather than being
    dropped: evaluation must see every example, and training data is length-filtered by its task.
    """

    def __init__(self, sampler: Sampler[int], sizes: Sequence[int], max_tokens: int, *,
                 num_replicas: int = 1, rank: int = 0, even: bool = True):
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens} must be >= 1")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank={rank} must be in [0, num_replicas={num_replicas})")
        self.sampler = sampler
        self.sizes = torch.as_tensor(list(sizes), dtype=torch.long)
        self.max_tokens, self.num_replicas, self.rank, self.even = max_tokens, num_replicas, rank, even

    def batches(self) -> list[list[int]]:
        """This epoch's batches, all processes together, in the order they are served."""
        order = torch.as_tensor(list(self.sampler), dtype=torch.long)
        if len(order) == 0:
            return []
        by_size = order[torch.argsort(self.sizes[order], stable=True)]
        batches, start, longest = [], 0, 0
        for i, size in enumerate(self.sizes[by_size].tolist()):
            longest = max(longest, size)
            if i > start and (i - start + 1) * longest > self.max_tokens:
                batches.append(by_size[start:i].tolist())
                start, longest = i, size
        batches.append(by_size[start:].tolist())
        # The first len(batches) entries of a uniformly random order are themselves in uniformly
        # random relative order; a sequential sampler leaves the batches sorted by length.
        served = torch.argsort(order[: len(batches)], stable=True).tolist()
        return [batches[j] for j in served]

    def _shard(self) -> list[list[int]]:
        batches = self.batches()
        if self.even and batches and len(batches) % self.num_replicas:
            pad = self.num_replicas - len(batches) % self.num_replicas
            batches += (batches * pad)[:pad]
        return batches[self.rank::self.num_replicas]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._shard())

    def __len__(self) -> int:
        return len(self._shard())
