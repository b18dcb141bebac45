"""The one LightningDataModule: data loaders over a Task's datasets.

The task decides what the examples are and how they are collated; this class only decides how
they are batched and loaded, so Lightning can add distributed samplers and worker processes
uniformly for every task. Datasets are built on first use and kept.

Batches hold `data.batch_size` examples, or, when the task bounds a split by tokens
(`Task.max_tokens`), as many length-bucketed examples as fit that many padded tokens
(batching.TokenBatchSampler).

Distributed sampling is done here, not by Lightning (the trainer is built with
``use_distributed_sampler=False``): token batches must be sharded as whole batches, which
Lightning's sampler injection cannot do. Training shuffles with a DistributedSampler seeded by the
experiment's seed (what Lightning would inject), on one process too, and serves it through a
resumable.ResumableDataLoader: a run resumed mid-epoch continues that epoch's order where the
checkpoint left it instead of starting the epoch over. A streamed training split (api/stream.py,
a task's `train_size=0`) has no order to shuffle: step s takes the stream's s-th global batch,
each rank its slice, through the same resumable loader. A DistributedSampler pads a split to
a multiple of the world size by repeating examples, which would bias the final numbers;
`trainer.validate` / `test` (the final evaluation and `relpos-lab eval`) therefore shard without
repeats; ranks may then differ by one batch, which is safe there because no collective runs per
batch. A split with fewer examples (or token batches) than processes leaves some ranks without a
batch; such a rank is served one empty batch (`EMPTY`, which the module skips), because a rank
with nothing to iterate would either fail Lightning's zero-length check or skip the epoch's end
and leave the others waiting in the metrics' gather. Validation inside `fit` keeps the padded
sharding, since DDP's forward may synchronise buffers on every batch.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import lightning as L
from lightning.pytorch.trainer.states import TrainerFn
from omegaconf import DictConfig
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, Sampler, SequentialSampler

from relpos_lab.api.contract import Checked
from relpos_lab.api.errors import ConfigError
from relpos_lab.api.stream import Stream, StreamBatches
from relpos_lab.api.task import Task
from relpos_lab.training.batching import TokenBatchSampler
from relpos_lab.training.resumable import ResumableDataLoader


class TaskDataModule(L.LightningDataModule):
    def __init__(self, task: Task, cfg: DictConfig, test_split: str = "test"):
        super().__init__()
        task.check_split(test_split)
        if hasattr(task, "pad_to_multiple"):  # a Seq2SeqTask: its collate rounds lengths up
            task.pad_to_multiple = cfg.get("pad_to_multiple", 1)
        self.task, self.cfg, self.test_split = task, cfg, test_split
        self._datasets: dict[str, Dataset] = {}

    def prepare_data(self) -> None:
        self.task.prepare_data()

    def setup(self, stage: str) -> None:
        # Fitting also loads the test split: a missing or broken test file must stop the run
        # before training, not after it (the final evaluation runs on it).
        needed = {"fit": ("train", "valid", self.test_split), "validate": ("valid",), "test": (self.test_split,)}
        for split in needed.get(stage, ()):
            self.dataset(split)

    def dataset(self, split: str) -> Dataset:
        if split not in self._datasets:
            self.task.check_split(split)
            self._datasets[split] = self.task.dataset(split)
        return self._datasets[split]

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", self.cfg.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("valid", self.cfg.eval_batch_size)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_split, self.cfg.eval_batch_size)

    def _loader(self, split: str, batch_size: int, shuffle: bool = False) -> DataLoader:
        dataset, workers, trainer = self.dataset(split), self.cfg.num_workers, self.trainer
        world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        fitting = trainer is None or trainer.state.fn == TrainerFn.FITTING
        collate = Checked(self.task, "collate")  # its first batch checked against the Task contract
        common = dict(collate_fn=collate, num_workers=workers, persistent_workers=workers > 0)
        max_tokens = self.task.max_tokens(split)
        if isinstance(dataset, Stream):
            if max_tokens:
                raise ConfigError(f"task '{self.task.cfg.name}' streams its training data (train_size=0) and bounds "
                                  "batches by tokens; a stream's steps hold data.batch_size examples each: give the "
                                  "task a train_size, or batch by examples")
            dataset.per_step = batch_size * world
            steps = trainer.max_steps if trainer is not None else 1
            return ResumableDataLoader(dataset, StreamBatches(batch_size, steps, world, rank), **common)
        if shuffle:  # training: an order that is a function of (seed, epoch), so a resume can rejoin it
            if max_tokens:  # one global order for every rank: the batches are sharded, not the examples
                order = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=self.task.seed)
                batches = TokenBatchSampler(order, self._sizes(dataset), max_tokens, num_replicas=world, rank=rank)
            else:
                order = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=self.task.seed)
                batches = BatchSampler(order, batch_size, drop_last=False)
            return ResumableDataLoader(dataset, batches, **common)
        if max_tokens:
            batches = TokenBatchSampler(SequentialSampler(dataset), self._sizes(dataset), max_tokens,
                                        num_replicas=world, rank=rank, even=fitting)
        elif world > 1 and fitting:
            batches = BatchSampler(DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False),
                                   batch_size, drop_last=False)
        else:  # every rank-th example, none repeated
            batches = BatchSampler(range(rank, len(dataset), world), batch_size, drop_last=False)
        if world > 1 and not fitting:
            batches = EveryRankBatches(batches, len(dataset) > 0)
            common["collate_fn"] = _CollateOrEmpty(collate)
        return DataLoader(dataset, batch_sampler=batches, **common)

    def _sizes(self, dataset: Dataset) -> list[int]:
        return [self.task.num_tokens(example) for example in dataset]


EMPTY = None  # the batch of a rank whose shard of an evaluation split is empty


class EveryRankBatches(Sampler[list[int]]):
    """A rank's evaluation batches, or one empty batch when the rank has none but the split has
    examples: every rank then runs the evaluation epoch, its end included, where the metrics are
    gathered across ranks. (`any_examples` is known on every rank alike: each holds the dataset.)"""

    def __init__(self, batches: Sampler[list[int]], any_examples: bool):
        self.batches, self.any_examples = batches, any_examples

    def __iter__(self) -> Iterator[list[int]]:
        served = False
        for batch in self.batches:
            served = True
            yield batch
        if not served and self.any_examples:
            yield []

    def __len__(self) -> int:
        return max(len(self.batches), int(self.any_examples))


class _CollateOrEmpty:
    """The task's collate, and `EMPTY` for the empty batch of EveryRankBatches (a class, not a
    closure, so worker processes can pickle it)."""

    def __init__(self, collate: Callable[[Sequence[Any]], Any]):
        self.collate = collate

    def __call__(self, examples: Sequence[Any]) -> Any:
        return self.collate(examples) if len(examples) else EMPTY
