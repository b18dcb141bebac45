"""Every private Lightning attribute relpos-lab uses (training/lightning_internals.py) still exists,
with the parameters our code passes: a Lightning release that changes one fails here, not in a
requeued job on a cluster."""
from __future__ import annotations

import importlib
import inspect

import pytest

from relpos_lab.training.lightning_internals import INTERNALS


def owner_class(owner: str) -> type:
    module, _, name = owner.partition(":")
    return getattr(importlib.import_module(module), name)


def instance_of(cls: type, tmp_path):
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger, WandbLogger
    from lightning.pytorch.loggers.csv_logs import ExperimentWriter

    if cls is L.Trainer:
        return L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=1)
    if cls.__name__ == "_TrainingEpochLoop":
        return instance_of(L.Trainer, tmp_path).fit_loop.epoch_loop
    if cls is ExperimentWriter:
        return ExperimentWriter(str(tmp_path / "csv"))
    if cls is CSVLogger:
        return CSVLogger(str(tmp_path))
    if cls is WandbLogger:
        return WandbLogger(offline=True, save_dir=str(tmp_path), id="probe")
    raise AssertionError(f"no probe instance for {cls}")


@pytest.mark.parametrize("internal", INTERNALS, ids=lambda i: f"{i.owner.split(':')[1]}.{i.name}")
def test_each_lightning_internal_we_use_still_exists(internal, tmp_path):
    cls = owner_class(internal.owner)
    if internal.parameters is None:
        assert hasattr(instance_of(cls, tmp_path), internal.name), (
            f"{internal.owner}.{internal.name} is gone ({internal.used_by})")
        return
    method = getattr(cls, internal.name, None)
    assert method is not None, f"{internal.owner}.{internal.name} is gone ({internal.used_by})"
    assert tuple(inspect.signature(method).parameters) == internal.parameters, internal.used_by


def test_the_requeue_path_finds_the_cluster_environment(tmp_path):
    import lightning as L

    trainer = instance_of(L.Trainer, tmp_path)
    assert hasattr(trainer._accelerator_connector, "cluster_environment")
