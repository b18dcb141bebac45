"""Token batching: bounded padded size, length bucketing, shuffling by epoch, sharding for DDP."""
from __future__ import annotations

import random

import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.data import DistributedSampler, SequentialSampler

from relpos_lab.api import Pair, Seq2SeqTask, TaskConfig, Vocabulary
from relpos_lab.config import DataConfig
from relpos_lab.training.batching import TokenBatchSampler
from relpos_lab.training.data import TaskDataModule

_rng = random.Random(0)
SIZES = [_rng.randint(1, 40) for _ in range(500)]


def shuffled(n: int, epoch: int = 0, seed: int = 0) -> DistributedSampler:
    """The global order every rank shares: one replica, shuffled by (seed, epoch)."""
    sampler = DistributedSampler(range(n), num_replicas=1, rank=0, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return sampler


def cost(batch: list[int]) -> int:
    return len(batch) * max(SIZES[i] for i in batch)


def test_no_batch_is_over_max_tokens():
    batches = list(TokenBatchSampler(shuffled(len(SIZES)), SIZES, max_tokens=100))
    assert batches and all(cost(b) <= 100 for b in batches)
    assert max(cost(b) for b in batches) > 80  # and batches are filled, not trivially small


def test_every_example_is_in_exactly_one_batch():
    batches = list(TokenBatchSampler(shuffled(len(SIZES)), SIZES, max_tokens=100))
    assert sorted(i for b in batches for i in b) == list(range(len(SIZES)))


def test_batches_hold_examples_of_similar_length():
    batches = list(TokenBatchSampler(shuffled(len(SIZES)), SIZES, max_tokens=100))
    ranges = sorted((min(SIZES[i] for i in b), max(SIZES[i] for i in b)) for b in batches)
    assert all(hi <= next_lo for (_, hi), (next_lo, _) in zip(ranges, ranges[1:]))  # no overlap


def test_an_example_over_max_tokens_is_a_batch_of_its_own():
    batches = list(TokenBatchSampler(SequentialSampler(range(4)), [3, 50, 3, 3], max_tokens=10))
    assert [1] in batches and sorted(i for b in batches for i in b) == [0, 1, 2, 3]


def test_without_shuffling_batches_come_sorted_by_length_and_are_reproducible():
    sampler = TokenBatchSampler(SequentialSampler(SIZES), SIZES, max_tokens=100)
    batches = list(sampler)
    firsts = [SIZES[b[0]] for b in batches]
    assert firsts == sorted(firsts) and batches == list(sampler)


def test_each_epoch_shuffles_the_batches_and_their_order():
    first = list(TokenBatchSampler(shuffled(len(SIZES), epoch=0), SIZES, max_tokens=100))
    again = list(TokenBatchSampler(shuffled(len(SIZES), epoch=0), SIZES, max_tokens=100))
    second = list(TokenBatchSampler(shuffled(len(SIZES), epoch=1), SIZES, max_tokens=100))
    assert first == again and first != second
    assert [SIZES[b[0]] for b in first] != sorted(SIZES[b[0]] for b in first)  # not served by length
    assert {tuple(sorted(b)) for b in first} != {tuple(sorted(b)) for b in second}  # new companions


@pytest.mark.parametrize("world", [2, 3])
def test_ddp_ranks_get_equal_shares_of_one_global_batch_list(world):
    samplers = [TokenBatchSampler(shuffled(len(SIZES)), SIZES, max_tokens=100, num_replicas=world, rank=r)
                for r in range(world)]
    shards = [list(s) for s in samplers]
    assert len({len(s) for s in shards}) == 1 and len(samplers[0]) == len(shards[0])
    total = len(samplers[0].batches())
    assert sum(map(len, shards)) == total + (-total) % world  # the list padded to a multiple of world
    assert sorted({i for s in shards for b in s for i in b}) == list(range(len(SIZES)))


def test_evaluation_shards_have_no_repeats():
    shards = [list(TokenBatchSampler(SequentialSampler(SIZES), SIZES, max_tokens=100, num_replicas=3,
                                     rank=r, even=False)) for r in range(3)]
    assert sorted(i for s in shards for b in s for i in b) == list(range(len(SIZES)))


# --- through the data module --------------------------------------------------------------------


class _Lengths(Seq2SeqTask):
    """Pairs of varied lengths, batched by tokens."""

    def build_vocab(self) -> Vocabulary:
        return Vocabulary("ab")

    def dataset(self, split: str) -> list[Pair]:
        rng = random.Random(split)
        return [Pair(torch.full((rng.randint(1, 30),), 4), torch.full((rng.randint(1, 30),), 5)) for _ in range(300)]

    def max_tokens(self, split: str) -> int:
        return 64 if split == "train" else 128


def test_the_data_module_bounds_padded_batches_by_the_tasks_max_tokens():
    data = TaskDataModule(_Lengths(TaskConfig(name="lengths")), OmegaConf.structured(DataConfig))
    for loader, bound in ((data.train_dataloader(), 64), (data.val_dataloader(), 128)):
        batches = list(loader)
        assert sum(b["src"].shape[0] for b in batches) == 300
        assert all(b["src"].numel() <= bound and b["tgt_out"].numel() <= bound for b in batches)
    assert hasattr(data.train_dataloader().batch_sampler.sampler, "set_epoch")  # Lightning reshuffles


def test_without_max_tokens_batches_keep_their_example_count():
    class Fixed(_Lengths):
        def max_tokens(self, split):
            return None

    data = TaskDataModule(Fixed(TaskConfig(name="fixed")), OmegaConf.structured(DataConfig(batch_size=32)))
    assert [b["src"].shape[0] for b in data.train_dataloader()] == [32] * 9 + [12]
