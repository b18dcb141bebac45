"""What a run prints while it trains: a bar at a terminal, plain lines in a log, and little else.

At a terminal, `StepProgressBar` (Lightning's RichProgressBar) counts optimizer steps out of
``trainer.max_steps`` with the time left; Lightning's own bar counted the batches of an "epoch"
(``Epoch 3/-2``: the loop runs with ``max_epochs=-1``). In a file (a SLURM ``.out``, a pipe), a
live bar leaves one frozen frame behind, so `ProgressLines` (a Lightning ProgressBar too) writes a
plain line every ``trainer.log_every_n_steps`` steps and after each validation:

    step 150/1000 (15%)  loss 2.1034  38.2 steps/s  ETA 0:00:22
    step 150/1000 valid  exact_match 0.1250  token_accuracy 0.5312  loss 1.9876

`quiet` keeps the rest of the console for the run's own lines (the run directory first): the
messages of Lightning and W&B that say nothing about this run (accelerators available, the
litlogger tip, the srun hint, W&B's banner and closing history, Lightning's model summary table
with its zero FLOPs, the callbacks `eval` does not restore, "Detected KeyboardInterrupt") are left out unless the
user asks for them (`relpos-lab train -v`).
"""
from __future__ import annotations

import logging
import re
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelSummary, ProgressBar, RichProgressBar
from lightning.pytorch.utilities.model_summary import get_human_readable_count

# Lightning's info lines that are about Lightning or the machine, not this run.
NOISE = re.compile("|".join((
    r"^(GPU|TPU|HPU|IPU) available",
    r"litlogger",
    r"^`Trainer\.fit` stopped: `max_steps=\d+` reached",
    r"^Restoring states from the checkpoint path",
    r"^Restored all states from the checkpoint",
    r"^Loaded model weights from the checkpoint",
    r"^LOCAL_RANK: \d+ - CUDA_VISIBLE_DEVICES",
    r"^You are using a CUDA device .* Tensor Cores",
    r"^Trainer already configured with model summary callbacks",
    r"^\s*Detected KeyboardInterrupt, attempting graceful shutdown",  # Ctrl-C: the run says what it does
)))
SRUN_HINT = r"The `srun` command is available on your system but is not used"
RESUMED = r"Checkpoint directory .* exists and is not empty"  # every resumed run's
# Every `eval`'s: it restores a checkpoint's weights into a Trainer without the training callbacks
# (checkpointing, ValidateLastStep) whose states the checkpoint holds, on purpose.
EVAL_CALLBACKS = r"Be aware that when using `ckpt_path`, callbacks used to create the checkpoint need to be provided"


def progress_bar(every_n_steps: int, interactive: bool | None = None) -> ProgressBar:
    """The bar for a terminal, plain lines for anything else (decided by whether stdout is a terminal)."""
    if interactive is None:
        interactive = sys.stdout.isatty()
    return StepProgressBar(every_n_steps) if interactive else ProgressLines(every_n_steps)


class StepProgressBar(RichProgressBar):
    """Rich's bar over optimizer steps: ``Training ━━━━ 150/1000 0:00:04 • 0:00:22 38.2it/s loss``.

    The loss shown is read every `every_n_steps` steps, as the lines and the loggers read it: reading
    it at every step would make each step wait for the device."""

    def __init__(self, every_n_steps: int = 1) -> None:
        super().__init__()
        self.every_n_steps = max(int(every_n_steps), 1)
        self._loss: dict[str, float] = {}

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # one task for the whole fit (the base class starts one per epoch, of the epoch's batches)
        if not self.is_disabled and self.progress is not None and self.train_progress_bar_id is None:
            self._initialize_train_progress_bar_id()
        self.refresh()

    def _initialize_train_progress_bar_id(self) -> None:
        self.train_progress_bar_id = self._add_task(max(self.trainer.max_steps, 1), "Training")
        self.progress.update(self.train_progress_bar_id, completed=self.trainer.global_step)  # resumed runs

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self.is_disabled and self.train_progress_bar_id is None:
            self._initialize_train_progress_bar_id()
        self._update(self.train_progress_bar_id, trainer.global_step)
        self._update_metrics(trainer, pl_module)
        self.refresh()

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)  # the W&B run id's tail: nothing to read
        loss = trainer.callback_metrics.get("train/loss")
        if loss is not None and (not self._loss or trainer.global_step % self.every_n_steps == 0):
            self._loss = {"train/loss": float(loss)}
        return {**metrics, **self._loss}


class ProgressLines(ProgressBar):
    """A plain line every `every_n_steps` optimizer steps (and at the last), one after each
    validation; with `every_n_steps` 0, the validations' lines only."""

    def __init__(self, every_n_steps: int, write: Callable[[str], None] | None = None) -> None:
        super().__init__()
        self.every_n_steps = int(every_n_steps)
        self._write = write
        self._enabled = True
        self._start: tuple[float, int] = (0.0, 0)  # (time, step) the fit started at
        self._last: tuple[float, int] = (0.0, 0)  # (time, step) of the last line

    def disable(self) -> None:  # Lightning disables the bar on ranks other than 0
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def write(self, line: str) -> None:
        if self._write is not None:
            self._write(line)
        else:
            print(line, flush=True)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = self._last = (time.monotonic(), trainer.global_step)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step, total = trainer.global_step, trainer.max_steps
        if (not self._enabled or not self.every_n_steps or step == self._last[1]
                or (step % self.every_n_steps and step < total)):
            return
        now = time.monotonic()
        rate = (step - self._last[1]) / max(now - self._last[0], 1e-9)
        mean = (step - self._start[1]) / max(now - self._start[0], 1e-9)
        self._last = (now, step)
        loss = trainer.callback_metrics.get("train/loss")
        parts = [f"step {step}/{total} ({100 * step // max(total, 1)}%)"]
        if loss is not None:
            parts.append(f"loss {float(loss):.4f}")
        parts += [f"{rate:.2f} steps/s", f"ETA {_duration((total - step) / mean if mean > 0 else 0)}"]
        self.write("  ".join(parts))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._enabled or trainer.sanity_checking or trainer.state.fn != "fit":
            return
        values = [f"{k.removeprefix('valid/')} {float(v):.4f}" for k, v in trainer.callback_metrics.items()
                  if k.startswith("valid/") and getattr(v, "numel", lambda: 1)() == 1]
        if values:
            self.write(f"step {trainer.global_step}/{trainer.max_steps} valid  " + "  ".join(values))


class LongRunNotice(L.Callback):
    """One line, early in a fit that will take long: how many steps it trains, its estimated time
    here and how to shorten it; a fresh run says its steps, a resumed or extended one the steps it
    has left ("more"). Printed after `after_steps` steps timed past the first few (which compile,
    warm up caches, or load data), whether or not progress is shown (`debug` turns it off). That
    first pace is a short sample: once `settle_steps` more steps are timed (the real step time),
    the estimate is said again if it moved by over a quarter, or first said if the run only now
    looks long."""

    def __init__(self, threshold_seconds: float = 600.0, after_steps: int = 10, warmup_steps: int = 3,
                 settle_steps: int = 100, write: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold, self.after, self.warmup = threshold_seconds, after_steps, warmup_steps
        self.settle = settle_steps
        self._write, self._clock = write or (lambda line: print(line, flush=True)), clock
        self._first_step: int | None = None  # the fit's first step: above 0 when it resumes or extends a run
        self._start: tuple[float, int] | None = None  # (time, step) where timing starts, after the warm-up
        self._estimate: tuple[float, int, float] | None = None  # (time, step, seconds a step) of the first estimate
        self._said: float | None = None  # the seconds a step of the line printed, if one was
        self._seen = 0  # batches this fit has run
        self._done = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._first_step = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._done or not trainer.is_global_zero:
            return
        step = trainer.global_step
        if self._first_step is None:  # no on_train_start seen: the batch that just ended was the fit's first
            self._first_step = max(step - 1, 0)
        self._seen += 1
        if self._start is None:
            if self._seen >= self.warmup:
                self._start = (self._clock(), step)
            return
        if self._estimate is None:
            timed = step - self._start[1]
            if timed >= self.after:
                per_step = (self._clock() - self._start[0]) / timed
                self._estimate = (self._clock(), step, per_step)
                self._tell(trainer, step, per_step)
            return
        since, at, first = self._estimate
        if step - at < self.settle:
            return
        self._done = True  # the real step time is known: this is the last word
        per_step = (self._clock() - since) / (step - at)
        if self._said is None or not 0.8 <= per_step / self._said <= 1.25:
            self._tell(trainer, step, per_step, was=first if self._said is not None else None)

    def _tell(self, trainer: L.Trainer, step: int, per_step: float, was: float | None = None) -> None:
        left = (trainer.max_steps - step) * per_step
        if left <= self.threshold and was is None:
            return
        self._said = per_step
        if was is not None:
            self._write(f"this run: about {_duration(left)} to go at {per_step:.3g} s a step here, timed over "
                        f"{self.settle:,} steps (the first {self.after} timed said {was:.3g} s a step)")
            return
        first = self._first_step or 0
        steps = (f"{trainer.max_steps - first:,} more steps (from step {first:,} to {trainer.max_steps:,})" if first
                 else f"{trainer.max_steps:,} steps")
        self._write(f"this run trains {steps}, about {_duration(left)} to go at {per_step:.3g} s a step here; "
                    "`debug` makes it a smoke test of a few seconds, trainer.max_steps=N shortens it")


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    text = f"{hours}:{rest // 60:02d}:{rest % 60:02d}"
    return f"{days}d {text}" if days else text


class OneLineSummary(ModelSummary):
    """The model summary in one line, for quiet runs (Lightning's table with -v)."""

    @staticmethod
    def summarize(summary_data: list, total_parameters: int, trainable_parameters: int, model_size: float,
                  total_training_modes: dict, total_flops: int = 0, **kwargs: Any) -> None:
        print(f"Model: {get_human_readable_count(int(total_parameters))} parameters "
              f"({get_human_readable_count(int(trainable_parameters))} trainable, {model_size:.2f} MB)", flush=True)


class _Noise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return NOISE.search(record.getMessage()) is None


_quiet = False


def quiet(verbose: bool = False) -> None:
    """Leave out Lightning's and W&B's chatter for the rest of this process, unless `verbose`.

    W&B is told by the run's loggers (`is_quiet`, records/wandb_run.py: its failures still reach the
    console as relpos-lab's own warnings); Lightning's lines through a filter on its log handlers.
    """
    global _quiet
    _quiet = not verbose
    if verbose:
        return
    warnings.filterwarnings("ignore", message=SRUN_HINT)
    warnings.filterwarnings("ignore", message=RESUMED)
    warnings.filterwarnings("ignore", message=EVAL_CALLBACKS)
    noise = _Noise()
    for name in ("lightning.pytorch", "lightning.fabric", ""):
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, _Noise) for f in handler.filters):
                handler.addFilter(noise)


def is_quiet() -> bool:
    """Whether `quiet` was asked for: the Trainer then prints a one-line model summary, W&B nothing."""
    return _quiet
