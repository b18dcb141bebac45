"""The private parts of Lightning that relpos-lab relies on, in one place.

Each is used where Lightning has no public hook for what a run needs (requeue between steps, a
CSV file that survives a resume, W&B runs that rewind). A Lightning release may change any of them
without notice, so tests/test_lightning_internals.py checks every entry against the installed
version, and pyproject.toml pins lightning to the minor version those tests ran on.
"""
from __future__ import annotations

from typing import NamedTuple


class Internal(NamedTuple):
    owner: str  # "module:Class"
    name: str  # attribute or method
    parameters: tuple[str, ...] | None  # a method's parameter names; None: an attribute of an instance
    used_by: str


INTERNALS: tuple[Internal, ...] = (
    Internal("lightning.pytorch.trainer.connectors.signal_connector:_SignalConnector", "_slurm_sigusr_handler_fn",
             ("self", "signum", "_"), "training/requeue.py: Lightning's own SLURM requeue, run between steps"),
    Internal("lightning.pytorch.trainer.connectors.logger_connector.logger_connector:_LoggerConnector",
             "update_train_step_metrics", ("self",),
             "training/requeue.py, interrupt.py: log the current step's row before stopping"),
    Internal("lightning.pytorch:Trainer", "_signal_connector", None, "training/requeue.py"),
    Internal("lightning.pytorch:Trainer", "_logger_connector", None, "training/requeue.py, interrupt.py"),
    Internal("lightning.pytorch:Trainer", "_accelerator_connector", None,
             "training/requeue.py: its cluster_environment tells a SLURM job from a local run"),
    Internal("lightning.pytorch.loggers.csv_logs:ExperimentWriter", "_check_log_dir_exists", ("self",),
             "records/metrics_csv.py: read the existing metrics.csv header instead of deleting the file"),
    Internal("lightning.pytorch.loggers.csv_logs:ExperimentWriter", "_fs", None, "records/metrics_csv.py"),
    Internal("lightning.pytorch.loggers:CSVLogger", "_experiment", None,
             "records/metrics_csv.py: our appending writer"),
    Internal("lightning.pytorch.loggers:CSVLogger", "_fs", None, "records/metrics_csv.py"),
    Internal("lightning.pytorch.loggers:WandbLogger", "_wandb_init", None,
             "records/wandb_run.py: wandb.init arguments (rewind on resume, anonymous)"),
    Internal("lightning.pytorch.loggers:WandbLogger", "_id", None, "records/wandb_run.py: the run id to rewind"),
    Internal("lightning.pytorch.callbacks:ModelCheckpoint", "_save_topk_checkpoint",
             ("self", "trainer", "monitor_candidates"),
             "training/final_validation.py: a validation after fit (a resumed run's last step) "
             "offered to the best checkpoint"),
    Internal("lightning.pytorch.callbacks:ModelCheckpoint", "_monitor_candidates", ("self", "trainer"),
             "training/final_validation.py"),
    Internal("lightning.pytorch.loops.training_epoch_loop:_TrainingEpochLoop", "_batches_that_stepped", None,
             "training/final_validation.py: the logging step of a fit resumed from a finished fit's checkpoint"),
    Internal("lightning.pytorch.plugins.io:TorchCheckpointIO", "save_checkpoint",
             ("self", "checkpoint", "path", "storage_options"), "training/checkpoints.py: atomic checkpoint writes"),
)
