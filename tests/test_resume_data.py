"""Resuming mid-epoch continues the epoch's data order where the checkpoint left it."""
from __future__ import annotations

import random

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from omegaconf import OmegaConf

from relpos_lab.api import Pair, Seq2SeqTask, TaskConfig, Vocabulary, registry
from relpos_lab.config import DataConfig, config_from_container
from relpos_lab.training.data import TaskDataModule
from relpos_lab.training.module import RelposModule
from relpos_lab.training.trainer import build_trainer


class _Numbered(Seq2SeqTask):
    """Examples of varied length whose tokens say which example they are."""

    def __init__(self, cfg: TaskConfig, max_tokens: int | None):
        super().__init__(cfg)
        self._max_tokens = max_tokens

    def build_vocab(self) -> Vocabulary:
        return Vocabulary("ab")

    def dataset(self, split: str) -> list[Pair]:
        rng = random.Random(0)
        return [Pair(torch.full((rng.randint(1, 12),), 4 + i), torch.full((3,), 4)) for i in range(200)]

    def max_tokens(self, split: str) -> int | None:
        return self._max_tokens


def examples(batch: dict) -> list[int]:
    return sorted(int(row[0]) - 4 for row in batch["src"])


@pytest.mark.parametrize("max_tokens", [None, 48], ids=["examples", "tokens"])
@pytest.mark.parametrize("epoch", [0, 3])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_loaders_state_resumes_the_epoch_after_the_batches_already_served(max_tokens, epoch, workers):
    """With worker processes, batches they prefetched but the loop has not taken do not count."""
    def loader():
        data = TaskDataModule(_Numbered(TaskConfig(name="numbered"), max_tokens),
                              OmegaConf.structured(DataConfig(batch_size=16, num_workers=workers)))
        return data.train_dataloader()

    first = loader()
    first.batch_sampler.sampler.set_epoch(epoch)
    whole = [examples(b) for b in first]
    assert len(whole) == len(first) > 6 and sorted(sum(whole, [])) == list(range(200))
    served = iter(first)
    head = [examples(next(served)) for _ in range(5)]
    state = first.state_dict()
    assert state == {"epoch": epoch, "batches": 5} and head == whole[:5]

    resumed = loader()
    resumed.load_state_dict(state)
    resumed.batch_sampler.sampler.set_epoch(epoch)  # Lightning does this after load_state_dict
    assert [examples(b) for b in resumed] == whole[5:]
    assert resumed.state_dict() == {"epoch": epoch, "batches": len(whole)}
    assert [examples(b) for b in resumed] == whole  # the skip applies to the resumed pass only


def test_a_state_saved_after_the_epochs_last_batch_resumes_with_the_next_epoch_whole():
    data = TaskDataModule(_Numbered(TaskConfig(name="numbered"), None), OmegaConf.structured(DataConfig(batch_size=16)))
    first = data.train_dataloader()
    list(first)
    resumed = data.train_dataloader()
    resumed.load_state_dict(first.state_dict())
    resumed.batch_sampler.sampler.set_epoch(1)
    first.batch_sampler.sampler.set_epoch(1)
    assert [examples(b) for b in resumed] == [examples(b) for b in first]


TINY = {
    "task": {"name": "reverse", "train_lengths": [1, 4], "valid_lengths": [1, 4], "test_lengths": [1, 6],
             "train_size": 256, "eval_size_per_length": 4},
    "model": {"d_model": 16, "n_heads": 2, "d_ff": 32, "n_encoder_layers": 1, "n_decoder_layers": 1,
              "dropout": 0.0, "attention_dropout": 0.0, "positions": {"scheme": "shaw", "max_distance": 4}},
    "data": {"batch_size": 16},
    "optim": {"lr": 0.003, "warmup_steps": 5},
    "trainer": {"accelerator": "cpu", "max_steps": 30, "val_every_n_steps": 1000, "num_sanity_val_steps": 0,
                "enable_progress_bar": False, "enable_model_summary": False},
}


class _Batches(Callback):
    def __init__(self):
        self.seen: list[torch.Tensor] = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.seen.append(batch["src"].clone())


def _fit(cfg, tmp_path, *, checkpoint_at=None, resume_from=None):
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    task = registry.create_task(OmegaConf.to_object(cfg.task), seed=cfg.seed)
    module, batches = RelposModule(cfg, task), _Batches()
    callbacks = [batches]
    if checkpoint_at:
        callbacks.append(ModelCheckpoint(dirpath=tmp_path, filename="at-{step}", save_top_k=-1,
                                         every_n_train_steps=checkpoint_at))
    trainer = build_trainer(cfg, tmp_path, loggers=[], callbacks=callbacks)
    trainer.fit(module, datamodule=TaskDataModule(task, cfg.data), ckpt_path=resume_from, weights_only=False)
    return batches.seen, module.state_dict()


def test_a_fit_resumed_mid_epoch_sees_the_batches_and_ends_with_the_weights_of_an_uninterrupted_one(tmp_path):
    cfg = config_from_container(TINY, "tiny")
    # 256 examples / 16 = 16 batches per epoch: step 20 is 4 batches into the second epoch.
    whole, weights = _fit(cfg, tmp_path, checkpoint_at=20)
    resumed, resumed_weights = _fit(cfg, tmp_path, resume_from=tmp_path / "at-step=20.ckpt")
    assert len(whole) == 30 and len(resumed) == 10
    assert all(torch.equal(a, b) for a, b in zip(resumed, whole[20:]))
    assert not torch.equal(whole[20], whole[4])  # the second epoch is not the first one again
    assert weights.keys() == resumed_weights.keys()
    assert all(torch.equal(weights[k], resumed_weights[k]) for k in weights)
