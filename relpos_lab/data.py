"""The one LightningDataModule: data loaders over a Task's datasets.

The task decides what the examples are and how they are collated; this class only decides how
they are batched and loaded, so Lightning can add distributed samplers and worker processes
uniformly for every task. Datasets are built on first use and kept.

Distributed evaluation: Lightning's DistributedSampler pads a split to a multiple of the world
size by repeating examples, which would bias the final numbers. `trainer.validate` / `test` (the
final evaluation and `relpos-lab eval`) therefore shard without repeats; ranks may then differ by
one batch, which is safe there because no collective runs per batch. Validation inside `fit`
keeps the padded sampler, since DDP's forward may synchronise buffers on every batch.
"""
from __future__ import annotations

import lightning as L
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from lightning.pytorch.trainer.states import TrainerFn
from omegaconf import DictConfig
from torch.utils.data import DataLoader, Dataset

from .task import Task


class TaskDataModule(L.LightningDataModule):
    def __init__(self, task: Task, cfg: DictConfig, test_split: str = "test"):
        super().__init__()
        task.check_split(test_split)
        self.task, self.cfg, self.test_split = task, cfg, test_split
        self._datasets: dict[str, Dataset] = {}

    def prepare_data(self) -> None:
        self.task.prepare_data()

    def setup(self, stage: str) -> None:
        needed = {"fit": ("train", "valid"), "validate": ("valid",), "test": (self.test_split,)}
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
        dataset, workers, sampler = self.dataset(split), self.cfg.num_workers, None
        trainer = self.trainer
        if trainer is not None and trainer.world_size > 1 and trainer.state.fn != TrainerFn.FITTING:
            sampler = UnrepeatedDistributedSampler(dataset, num_replicas=trainer.world_size,
                                                   rank=trainer.global_rank, shuffle=False)
        return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
                          collate_fn=self.task.collate, num_workers=workers,
                          persistent_workers=workers > 0)
