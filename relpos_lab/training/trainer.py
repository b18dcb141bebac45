"""The Lightning Trainer of an experiment, from the config's trainer section."""
from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from omegaconf import DictConfig

from relpos_lab.api.errors import UserError
from relpos_lab.training.checkpoints import AtomicCheckpointIO
from relpos_lab.training.progress import LongRunNotice, OneLineSummary, ProgressLines, is_quiet, progress_bar
from relpos_lab.training.rendezvous import ddp_strategy


def build_trainer(cfg: DictConfig, run_dir: Path, *, loggers: list, callbacks: list[Callback]) -> L.Trainer:
    """A Lightning Trainer from `cfg.trainer`; invalid hardware settings become UserErrors.

    The progress display depends on where stdout goes (progress.py): a bar over the steps at a
    terminal, a plain line every `log_every_n_steps` steps in a log file. DDP's processes wait
    `rendezvous_timeout_seconds` for each other at the start (rendezvous.py).
    """
    t = cfg.trainer
    check_hardware(cfg)
    callbacks = [*callbacks, LongRunNotice()]  # with progress or without (debug)
    # without a bar (debug, a sweep's logs) a line after each validation still says how it goes
    callbacks = [*callbacks, progress_bar(t.log_every_n_steps) if t.enable_progress_bar else ProgressLines(0)]
    if t.enable_model_summary and is_quiet():
        callbacks = [*callbacks, OneLineSummary()]
    try:
        return L.Trainer(
            default_root_dir=run_dir, logger=loggers or False, callbacks=callbacks,
            accelerator=t.accelerator, devices=t.devices, num_nodes=t.num_nodes, strategy=ddp_strategy(cfg),
            precision=t.precision, max_steps=t.max_steps, max_epochs=-1,
            val_check_interval=t.val_every_n_steps, check_val_every_n_epoch=None,
            log_every_n_steps=t.log_every_n_steps, gradient_clip_val=t.gradient_clip_val or None,
            accumulate_grad_batches=t.accumulate_grad_batches, num_sanity_val_steps=t.num_sanity_val_steps,
            deterministic=t.deterministic, enable_progress_bar=True,  # a bar, or ProgressLines
            enable_model_summary=t.enable_model_summary,
            enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
            use_distributed_sampler=False,  # TaskDataModule shards (token batches as whole batches)
            plugins=[AtomicCheckpointIO()],  # an interrupted write leaves the previous checkpoint intact
        )
    except (MisconfigurationException, ValueError) as err:
        raise UserError(f"trainer: {str(err).strip().splitlines()[0]}") from None



def check_hardware(cfg: DictConfig) -> None:
    """Settings the config schema accepts but this machine cannot run (checked where it runs)."""
    if cfg.trainer.precision == "16-mixed" and not _uses_gpu(cfg.trainer.accelerator):
        raise UserError("trainer.precision=16-mixed needs a GPU (fp16 autocast with gradient scaling); "
                        "on CPU use precision=32 or bf16-mixed")



def _uses_gpu(accelerator: str) -> bool:
    return accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())

