"""The one LightningModule: trains and evaluates the core model, asking the Task for specifics.

Lightning owns the loop (devices, precision, gradient clipping, checkpoints, logging); the Task
owns the problem (how a batch is scored, how it is evaluated). This class only connects the two,
so every task trains and evaluates the same way, and validation, test and `relpos-lab eval` all go
through `Task.evaluate` into an `Evaluation` — their numbers cannot disagree.

The resolved experiment config is saved as the checkpoint's hyperparameters: a checkpoint alone is
enough to rebuild its task and model (`relpos-lab eval CHECKPOINT`).
"""
from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities.seed import isolate_rng
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from relpos_lab.api.contract import Checked, check
from relpos_lab.api.evaluation import EvalResult
from relpos_lab.api.samples import LATER_ROWS, SampleSpread
from relpos_lab.api.task import Task
from relpos_lab.core.compiling import compile_model, compiled_in_place, graphs_compiled, is_compiled
from relpos_lab.core.embedding import seed_eval_positions
from relpos_lab.core.eval_dropout import dropout_at_eval
from relpos_lab.records.loggers import log_samples
from relpos_lab.training.data import EMPTY
from relpos_lab.training.optim import build_optimizer, build_scheduler

TASK_STATE = "task_state"  # checkpoint key of Task.state_dict(): a checkpoint alone rebuilds its task


class RelposModule(L.LightningModule):
    def __init__(self, cfg: DictConfig, task: Task, test_split: str = "test"):
        super().__init__()
        self.cfg, self.task, self.test_split = cfg, task, test_split
        # What the task returns is checked against its contract (api/contract.py), each verb on first use;
        # a model it returns as torch.compile(model) is held compiled in place, so checkpoints keep its keys.
        self.model = compiled_in_place(check(task, "build_model", task.build_model(OmegaConf.to_object(cfg.model))))
        compile_model(self.model, OmegaConf.select(cfg, "trainer.compile", default="none"))
        self.evaluations = nn.ModuleDict({s: check(task, "build_evaluation", task.build_evaluation(s))
                                          for s in dict.fromkeys(("valid", test_split))})
        self.task_loss, self.task_evaluate = Checked(task, "loss"), Checked(task, "evaluate")
        self.results: dict[str, EvalResult] = {}  # latest evaluation of each split
        self.start_step: int | None = None  # global step training (re)started from
        # splits evaluated but not logged: the final evaluation's "valid" (that checkpoint's
        # validation is logged already, at its step)
        self.unlogged: set[str] = set()
        self.evaluated_step: int | None = None  # the final test's checkpoint step, which its metrics are logged at
        self._samples: dict[str, SampleSpread] = {}
        self._eval_rng = ExitStack()  # trainer.eval_dropout: the generators' state around an evaluation
        self.save_hyperparameters({"config": OmegaConf.to_container(cfg, resolve=True)}, logger=False)

    def forward(self, *args: Any) -> Tensor:
        return self.model(*args)

    def results_notes(self) -> dict:
        """Keys this run's results.json adds to what every run's holds (a stacked member's `stopped`)."""
        return {}

    # --- training ---------------------------------------------------------------------------

    def on_train_start(self) -> None:
        self.start_step = self.global_step

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        out = self.task_loss(self.model, batch, self.cfg.optim.label_smoothing)
        size = _batch_size(batch)
        # Averaged over ranks (sync_dist): the loss of the global batch, whose gradient DDP averages,
        # rather than rank 0's shard; one scalar all-reduce each, next to the gradients' own. Not
        # prog_bar: Lightning reads its progress-bar metrics back at every step, a wait on the device;
        # the bar shows the loss as the loggers read it (progress.StepProgressBar).
        self.log("train/loss", out.loss, batch_size=size, sync_dist=True)
        self.log("train/nll", out.nll_sum / out.n_tokens.clamp_min(1), batch_size=size, sync_dist=True)
        return out.loss

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[TASK_STATE] = self.task.state_dict()

    def configure_optimizers(self):
        optimizer = build_optimizer(self.parameters(), self.cfg.optim)
        scheduler = build_scheduler(optimizer, self.cfg.optim, int(self.trainer.estimated_stepping_batches))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # --- evaluation: one path for validation, test and `eval` -------------------------------

    def on_validation_epoch_start(self) -> None:
        seed_eval_positions(self.model, self.cfg.seed)  # evaluation's randomized positions repeat (randomize_at_eval)

    def on_test_epoch_start(self) -> None:
        seed_eval_positions(self.model, self.cfg.seed)

    # trainer.eval_dropout: the reference's evaluation, dropout on, its masks drawn from the run's
    # seed and the training generators' state put back at the epoch's end (core/eval_dropout.py).

    def on_validation_model_eval(self) -> None:
        super().on_validation_model_eval()
        self._dropout_at_eval(True)

    def on_test_model_eval(self) -> None:
        super().on_test_model_eval()
        self._dropout_at_eval(True)

    def _dropout_at_eval(self, active: bool) -> None:
        if not OmegaConf.select(self.cfg, "trainer.eval_dropout", default=False):
            return
        if active:
            self._eval_rng.enter_context(isolate_rng())
            torch.manual_seed(self.cfg.seed)
        else:
            self._eval_rng.close()
        dropout_at_eval(self.model, active)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluate("valid", batch, batch_idx)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluate(self.test_split, batch, batch_idx)

    def on_validation_epoch_end(self) -> None:
        self._dropout_at_eval(False)  # Lightning then restores each module's mode
        self._finish("valid")

    def on_test_epoch_end(self) -> None:
        self._dropout_at_eval(False)
        self._finish(self.test_split)

    def _evaluate(self, split: str, batch: dict | None, batch_idx: int) -> None:
        if batch is EMPTY:  # this rank's shard of the split is empty; it still joins the gather
            return
        hyps = self.task_evaluate(self.model, batch, self.evaluations[split])
        n = self.cfg.logging.num_samples
        if hyps is not None and n > 0:  # every batch offers a few rows: the table spreads them over the lengths
            samples = self.task.sample_rows(batch, hyps, n if batch_idx == 0 else LATER_ROWS)
            if samples is not None:
                train = self.task.train_length_range()
                self._samples.setdefault(split, SampleSpread(n, train and train[1])).add(*samples)

    def _finish(self, split: str) -> None:
        result = self.evaluations[split].compute()  # reduced across ranks by torchmetrics
        self.evaluations[split].reset()
        if self.trainer.sanity_checking:
            return
        self.results[split] = result
        if split in self.unlogged:
            self._samples.pop(split, None)
            return
        # Values are already global; sync_dist keeps every rank's copy (checkpointing reads it).
        # "step": Lightning logs a row at a logged step metric; its own default, the count of
        # batches stepped before this one, is one less than the step whose weights were evaluated
        # (best-step=400.ckpt's validation would be row 399).
        # A compiled model's count of graphs so far, beside each validation: one that keeps rising
        # recompiles for new shapes (dynamo fails past torch._dynamo.config.recompile_limit).
        compiled = {"compile/graphs": float(graphs_compiled())} if is_compiled(self.model) else {}
        step = self.evaluated_step if split == self.test_split and self.evaluated_step is not None else self.global_step
        self.log_dict({f"{split}/{k}": v for k, v in result.metrics.items()} | compiled
                      | {"step": float(step)}, sync_dist=True, prog_bar=False)
        if self.trainer.is_global_zero and result.details:  # e.g. sacrebleu signatures
            for logger in self.loggers:
                logger.log_hyperparams({f"{split}/{k}": v for k, v in result.details.items()})
        if self.trainer.is_global_zero and split in self._samples:
            samples = self._samples.pop(split)
            log_samples(self.loggers, f"samples/{split}", samples.columns, samples.rows(), step=step)


def _batch_size(batch: dict) -> int:
    return next(v.shape[0] for v in batch.values() if isinstance(v, Tensor))
