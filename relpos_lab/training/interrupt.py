"""Nothing lost on an interrupt: Ctrl-C or SIGTERM checkpoints the current step before the run stops,
and last.ckpt is also refreshed every `trainer.checkpoint_every_minutes`.

A checkpoint must hold a consistent state (weights, optimizer, loop counters, the loader's place in
the epoch), which exists only between optimizer steps. So the signals only set a flag, as
requeue.py does for SLURM's: at the end of the current training step (Lightning's
``on_train_batch_end``, where its own periodic checkpoints are taken) the step's metrics are sent
to the loggers, ``checkpoints/last.ckpt`` is written (atomically, checkpoints.AtomicCheckpointIO),
and the run stops through Lightning's exception path (KeyboardInterrupt for Ctrl-C,
SIGTERMException for SIGTERM), which finishes the loggers. The caller (experiment.train) then
says where the checkpoint is and how to resume.

- Ctrl-C once: stop at the end of the current step (after a validation pass, if one is running)
  with a checkpoint. Ctrl-C twice: stop at once; the newest checkpoint on disk stays as it was.
- SIGTERM during training: this callback's handler replaces Lightning's and only notes it; the
  step's end checkpoints and stops. Lightning's own handler would also stop its loops wherever
  each rank happens to be and, under DDP, broadcasts inside the signal handler: ranks then wait
  in mismatched collectives until SLURM's SIGKILL (seen on the dev cluster after `scancel`). A
  SIGTERM during a validation pass is acted on at the next training step's end. Outside training
  (the final validate/test) Lightning's handler is back.
- Several processes (DDP) agree on both decisions with one boolean all-reduce each, so every rank
  saves at the same step.
- A run stopped by SIGTERM exits with `sigterm_exit`'s status, 143, unless SLURM is requeueing it.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException

from relpos_lab.records.loggers import RunCSVLogger

SIGNAL_NAMES = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM"}
_sigterm = threading.Event()  # SIGTERM noted by InterruptCheckpoint's handler in this process


def sigterm_exit(requeued: bool = False) -> SIGTERMException:
    """How a run stopped by SIGTERM ends: with 143 (128 + 15, what a shell reports for a process
    SIGTERM killed), so neither a shell's `&&` nor SLURM (a scancel'ed job, a time limit without a
    requeue) takes the unfinished run for a finished one. Lightning's bare SIGTERMException exits 0.
    An attempt that SLURM is requeueing (`requeued`) still exits 0, as Lightning's own requeue
    does: the job goes on in its next attempt."""
    return SIGTERMException() if requeued else SIGTERMException(128 + signal.SIGTERM)


def sigterm_received(trainer: L.Trainer) -> bool:
    """SIGTERM reached this process, through Lightning's handler or (while training) ours."""
    return trainer.received_sigterm or _sigterm.is_set()


class InterruptCheckpoint(Callback):
    """Checkpoint to `path` at the step boundary after Ctrl-C / SIGTERM (then stop), or every N minutes."""

    def __init__(self, path: Path, every_minutes: float = 0.0) -> None:
        self.path = Path(path)
        self.every_s = every_minutes * 60.0
        self.stopped_by: int | None = None  # the signal that stopped training, once handled
        self.saved_step: int | None = None  # step of the checkpoint written at the stop
        self._requested: int | None = None  # a signal received, waiting for the step's end
        self._previous = None  # SIGINT handler to restore
        self._previous_term = None  # SIGTERM handler (Lightning's) to restore
        self._last_save = time.monotonic()

    # --- signals ------------------------------------------------------------------------------

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_save = time.monotonic()
        if threading.current_thread() is threading.main_thread():
            _sigterm.clear()
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
            self._previous_term = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, _frame) -> None:
        _sigterm.set()
        if self._requested is None:
            self._requested = signum

    def _on_sigint(self, signum: int, _frame) -> None:
        if self._requested is not None:  # a second Ctrl-C: stop now, without a checkpoint
            self._restore()
            raise KeyboardInterrupt
        self._requested = signum
        os.write(2, b"\nrelpos-lab: Ctrl-C: saving a checkpoint at the end of this training step, then stopping "
                    b"(Ctrl-C again stops at once, without one)\n")

    def _restore(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
        if self._previous_term is not None:
            signal.signal(signal.SIGTERM, self._previous_term)
            self._previous_term = None

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._restore()
        if self.stopped_by is None and isinstance(exception, KeyboardInterrupt | SIGTERMException):
            self.stopped_by = signal.SIGINT if isinstance(exception, KeyboardInterrupt) else signal.SIGTERM

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._restore()

    # --- the step boundary ----------------------------------------------------------------------

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.fit_loop.epoch_loop._should_accumulate():  # gradients so far would not be saved
            return
        local = self._requested is not None or trainer.received_sigterm
        if trainer.strategy.reduce_boolean_decision(local, all=False):
            signum = self._requested or signal.SIGTERM
            trainer._logger_connector.update_train_step_metrics()  # this step's row, before the loggers finish
            trainer.save_checkpoint(self.path, weights_only=False)
            self.stopped_by, self.saved_step = signum, trainer.global_step
            self._restore()
            raise KeyboardInterrupt if signum == signal.SIGINT else SIGTERMException()
        due = self.every_s > 0 and time.monotonic() - self._last_save >= self.every_s
        if self.every_s > 0 and trainer.strategy.reduce_boolean_decision(due, all=False):
            self._save(trainer)
            self._last_save = time.monotonic()

    def _save(self, trainer: L.Trainer) -> None:
        trainer.save_checkpoint(self.path, weights_only=False)
        for logger in trainer.loggers:
            if isinstance(logger, RunCSVLogger):  # metrics.csv on disk up to the checkpoint
                logger.after_save_checkpoint(self)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self._last_save = time.monotonic()  # any checkpoint of the run restarts the clock

    @property
    def pending(self) -> int | None:
        """The Ctrl-C or SIGTERM that came after the last training step (during the last
        validation), not acted on yet; None if none did."""
        return self._requested if self.stopped_by is None else None


class StopRequests:
    """Ctrl-C, SIGTERM and SLURM's requeue signal as requests, for a loop outside Lightning (a
    stack's: training/stacked.py) that saves between its steps, as InterruptCheckpoint and
    requeue.DeferredRequeue do for a run: `signum` is the signal waiting, `raise_if_requested` stops
    the loop after the save (and requeues the job). A second Ctrl-C stops at once."""

    def __init__(self, requeue_signal: int | None = None) -> None:
        self.signum: int | None = None
        self.requeue_signal = requeue_signal
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopRequests:
        if threading.current_thread() is threading.main_thread():
            signals = (signal.SIGINT, signal.SIGTERM, *([self.requeue_signal] if self.requeue_signal else []))
            self._previous = {s: signal.signal(s, self._note) for s in signals}
        return self

    def _note(self, signum: int, _frame) -> None:
        if signum == signal.SIGINT and self.signum == signal.SIGINT:  # a second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.signum = self.signum or signum
        if signum == signal.SIGINT:
            os.write(2, b"\nrelpos-lab: Ctrl-C: saving the stack's checkpoint at the end of this step, then "
                        b"stopping (Ctrl-C again stops at once, without one)\n")

    def raise_if_requested(self, message: str, echo, requeue=None) -> None:
        """After the checkpoint of a step: stop as the signal asks (KeyboardInterrupt for Ctrl-C,
        `sigterm_exit`'s SIGTERMException for SIGTERM; for the requeue signal, `requeue()` first,
        and exit 0 as a requeued run does), saying where the work is."""
        if self.signum is None:
            return
        echo(message)
        if self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        requeued = self.signum == self.requeue_signal and requeue is not None
        if requeued:
            requeue()
        raise sigterm_exit(requeued)

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
