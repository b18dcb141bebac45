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
checkpoint left it instead of starting the epoch over. A DistributedSampler pads a split to
a multiple of the world size by repeating examples, which would bias the final numbers;
`trainer.validate` / `test` (the final evaluation and `relpos-lab eval`) therefore shard without
repeats; ranks may then differ by one batch, which is safe there because no collective runs per
batch. Validation inside `fit` keeps the padded sharding, since DDP's forward may synchronise
buffers on every batch.
"""
from __future__ import annotations

import lightning as L
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from lightning.pytorch.trainer.states import TrainerFn
from omegaconf import DictConfig
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, SequentialSampler

from relpos_lab.api.task import Task
from relpos_lab.training.batching import TokenBatchSampler
from relpos_lab.training.resumable import ResumableDataLoader


class TaskDataModule(L.LightningDataModule):
    def __init__(self, task: Task, cfg: DictConfig, test_split: str = "test"):
        super().__init__()
        task.check_split(test_split)
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
        common = dict(collate_fn=self.task.collate, num_workers=workers, persistent_workers=workers > 0)
        max_tokens = self.task.max_tokens(split)
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
            return DataLoader(dataset, batch_sampler=batches, **common)
        sampler = None
        if world > 1 and fitting:
            sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False)
        elif world > 1:
            sampler = UnrepeatedDistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False)
        return DataLoader(dataset, batch_size=batch_size, sampler=sampler, **common)

    def _sizes(self, dataset: Dataset) -> list[int]:
        return [self.task.num_tokens(example) for example in dataset]
