"""The last training step is always validated, so the best checkpoint is chosen over every
validated step, the last one included.

Lightning validates every `val_check_interval` batches only: with `trainer.max_steps=600` and a
validation every 400 steps, steps 401-600 were never validated, the best checkpoint could only be
best-step=400.ckpt, and results.json reported it without a word.

`ValidateLastStep` asks for that validation through Lightning's public stop request: at the end of
the last optimizer step it sets ``trainer.should_stop``, and Lightning's training loop validates
when a stop is requested (as it does for EarlyStopping), before the fit ends. It is the very
validation of the fit loop, so the best ModelCheckpoint sees it and saves best-step=<last>.ckpt
when it is the best; a step that is a validation step anyway is validated once. Every rank of a
distributed run reaches the same step, so all of them take that path.

It also records the step of the last validation of the fit in its checkpointed state. A resumed
run whose checkpoint is of the last step but was written before that step's validation (an
interrupt, the requeue signal or a periodic save at the last step, then a kill) has no step left to
train, so its fit validates nothing: `validate_if_missed` then validates the final weights and
hands the result to the best ModelCheckpoint as its own validation would have.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn


class ValidateLastStep(Callback):
    """Validate the fit's last step when it is not a validation step already; remember the last
    validated step (checkpointed, so a resumed run knows it)."""

    def __init__(self) -> None:
        self.validated_step: int | None = None  # global step of the fit's last validation
        self._counted = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._counted = False

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        # A fit resumed from the checkpoint written after an earlier fit ended (`train --extend`):
        # Lightning adds one to its count of stepped batches on a restart (a checkpoint taken inside
        # a step has not counted that step yet), one too many here, and every row would be logged a
        # step later than in an uninterrupted run. With one optimizer the count is the global step.
        if not self._counted:
            trainer.fit_loop.epoch_loop._batches_that_stepped = trainer.global_step
            self._counted = True

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        # global_step counts optimizer steps, so with gradient accumulation this is the batch
        # that completed the last step
        if 0 < trainer.max_steps <= trainer.global_step:
            trainer.should_stop = True  # Lightning validates before it stops

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # runs before ModelCheckpoint's on_validation_end (Lightning puts checkpoint callbacks
        # last), so the best checkpoint saved for this validation records it too
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            self.validated_step = trainer.global_step

    def state_dict(self) -> dict[str, Any]:
        return {"validated_step": self.validated_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.validated_step = state_dict.get("validated_step")

    def validate_if_missed(self, trainer: L.Trainer, module: L.LightningModule, datamodule: L.LightningDataModule,
                           best: ModelCheckpoint, last: Path) -> bool:
        """After `trainer.fit`: validate `last` (the checkpoint of the fit's last step) if the fit
        ended without validating its last step, and let `best` keep it if it is the best. True if
        it validated. Every rank calls it (a validation and a checkpoint are collective)."""
        if self.validated_step == trainer.global_step:
            return False
        # the path, not the weights in memory: under SLURM, Lightning would load an hpc checkpoint
        trainer.validate(module, datamodule=datamodule, ckpt_path=last, verbose=False, weights_only=False)
        self.validated_step = trainer.global_step
        # what ModelCheckpoint.on_validation_end does in a fit (it saves nothing outside one)
        candidates = best._monitor_candidates(trainer)
        if best.monitor in candidates:  # not when the split has no batches to validate
            best._save_topk_checkpoint(trainer, candidates)
        return True
