"""A training DataLoader that resumes mid-epoch at the batch where the checkpoint left off.

Lightning saves the state of every training loader that has ``state_dict`` / ``load_state_dict``
in the fit loop's checkpoint entry, restores it before the resumed fit creates its iterator, and
then expects the loader to serve only the epoch's remaining batches while ``len`` stays the whole
epoch (the fit loop adds the batches already done). A plain DataLoader starts the epoch over: the
batches seen before the interruption are seen twice and the epoch's last ones never.

The state is the epoch and how many batches the loader has handed to the training loop, counted
here in the main process, so batches that workers prefetched do not count. Resuming drops that many
batches from the batch sampler, so their examples are never loaded. This is exact only if an
epoch's order is a function of the epoch, which is why TaskDataModule always trains with a seeded
sampler that Lightning advances with ``set_epoch``.

The iterator does its work lazily, at the first ``next``: Lightning creates a resumed fit's
iterator *before* it calls ``set_epoch`` for the resumed epoch, and an eager iterator (or worker
processes that start prefetching when the iterator is made) would serve epoch 0's order.
"""
from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import Any

from torch.utils.data import DataLoader, Dataset, Sampler


class _SkippingBatches(Sampler[list[int]]):
    """The wrapped batch sampler without its first `skip` batches (set by the loader for each pass).

    Not reset by a pass: a multi-process DataLoader iterator calls ``iter`` on it twice per pass.
    """

    def __init__(self, batches: Sampler[list[int]]):
        self.batches, self.skip = batches, 0

    @property
    def sampler(self) -> Any:
        """The index sampler inside: Lightning finds ``set_epoch`` as ``batch_sampler.sampler``."""
        return getattr(self.batches, "sampler", None)

    def __iter__(self) -> Iterator[list[int]]:
        return islice(iter(self.batches), self.skip, None)

    def __len__(self) -> int:
        return len(self.batches)


class ResumableDataLoader(DataLoader):
    """A DataLoader over `batch_sampler` whose position in the epoch survives a checkpoint."""

    def __init__(self, dataset: Dataset, batch_sampler: Sampler[list[int]], **kwargs: Any):
        super().__init__(dataset, batch_sampler=_SkippingBatches(batch_sampler), **kwargs)
        self._epoch, self._served = 0, 0
        self._resume: dict[str, int] | None = None

    def __iter__(self) -> Iterator[Any]:
        epoch = getattr(self.batch_sampler.sampler, "epoch", 0)
        skip = 0
        if self._resume is not None:
            saved, self._resume = self._resume, None
            # A checkpoint written after the epoch's last batch resumes at the next epoch: no skip.
            if saved["epoch"] == epoch and saved["batches"] < len(self):
                skip = saved["batches"]
        self.batch_sampler.skip = skip
        self._epoch, self._served = epoch, skip
        for batch in super().__iter__():
            self._served += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self._epoch, "batches": self._served}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._resume = {"epoch": int(state["epoch"]), "batches": int(state["batches"])}
