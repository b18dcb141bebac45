"""SLURM auto-requeue that is safe with several processes: act on the signal between steps.

Lightning's SLURMEnvironment requeues a job on SIGUSR1 (sent by ``#SBATCH --signal=SIGUSR1@90``
before the time limit): it finishes the loggers, saves ``hpc_ckpt_N.ckpt`` into the run directory
and calls ``scontrol requeue``. It does all of that inside the signal handler, wherever each rank
happens to be. With DDP the ranks are rarely at the same point: one enters the checkpoint's
barrier while another waits in the gradient all-reduce of its backward pass, and both wait
forever (seen here on the dev cluster; a known Lightning bug,
https://github.com/Lightning-AI/pytorch-lightning/issues/21406, with a fix proposed in pull request 21407).

`DeferredRequeue` keeps Lightning's requeue code and only moves where it runs. The signal merely
sets a flag; after every training step the ranks agree (one boolean all-reduce) whether any of
them got it, and if so all of them call Lightning's handler at that same step. Then they wait for
the SIGTERM with which SLURM ends the requeued attempt and stop with Lightning's own
SIGTERMException, so nothing is logged or checkpointed after the hpc checkpoint. The next attempt
resumes from that checkpoint (checkpoints.resume_checkpoint) in the same run directory.

`on_train_batch_end` runs before Lightning sends the step's metrics to the loggers, and the
stop skips that; the step's metrics are therefore sent first, or the step of the checkpoint
would be missing from metrics.csv and W&B (the resumed attempt starts after it).

A signal during the final validate/test (after fitting, when no step boundary comes) requeues the
job at once, without a checkpoint: `last.ckpt` already holds the finished training, so the next
attempt's fit ends immediately and it evaluates again. After the evaluation finishing.py holds the
signal until results.json is written, and ignores it after that (the run is finished).

Four Lightning internals are used (the cluster environment, the requeue handler, the
accumulation test, the logger connector's step update); tests/test_slurm_cluster.py's requeue
test breaks if a Lightning release changes them.

`requested` tells the caller that this attempt stops because SLURM requeues it (it then exits 0,
interrupt.sigterm_exit), not because it was cancelled.

Outside SLURM, or with Lightning's auto-requeue switched off, the callback does nothing.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import lightning as L
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from relpos_lab.training.interrupt import sigterm_received

# How long to wait for SLURM's SIGTERM after asking for the requeue. It normally comes within a
# second; if it does not (a job submitted without --requeue, scontrol missing), training goes on
# and the time limit ends the job, with the hpc checkpoint already on disk.
SIGTERM_WAIT_S = 60.0


class DeferredRequeue(Callback):
    """Run Lightning's SLURM auto-requeue at a step boundary that every rank has reached."""

    def __init__(self, sigterm_wait_s: float = SIGTERM_WAIT_S) -> None:
        self.sigterm_wait_s = sigterm_wait_s
        self._signum: int | None = None  # the requeue signal, once received
        self._active = False
        self._requeue_at_start = False  # a requeue signal came between fit and this evaluation
        self._evaluating = False  # a validate/test stage: no training step will come to act at
        self._global_zero = False
        self.signum: int | None = None  # the requeue signal while auto-requeue is on (finishing.py holds it then)
        self.requested = False  # this attempt asked SLURM for its requeue: the SIGTERM that follows is SLURM's

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # setup runs before the Trainer registers its signal handlers, and Lightning does not
        # replace a requeue-signal handler that is already installed: ours stays the only one.
        env = trainer._accelerator_connector.cluster_environment
        if not (isinstance(env, SLURMEnvironment) and env.auto_requeue and env.requeue_signal is not None):
            return
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be installed from the main thread
        self._active, self.signum = True, env.requeue_signal
        self._evaluating, self._global_zero = stage != "fit", trainer.is_global_zero
        signal.signal(env.requeue_signal, self._note_signal)
        self._requeue_at_start = self._evaluating and self._signum is not None  # came after fit's last step

    def _requeue_if_noted(self) -> None:
        # At the evaluation's start, not in setup: Lightning registers its SIGTERM handler between
        # the two, and SLURM's SIGTERM follows the requeue at once (before it, SIGTERM killed the process).
        if self._requeue_at_start:
            self._requeue_at_start, self._signum, self.requested = False, None, True
            if self._global_zero:
                requeue_now()

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._evaluating:
            self._requeue_if_noted()

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._requeue_if_noted()

    def _note_signal(self, signum: int, _frame) -> None:
        if self._evaluating:  # nothing to checkpoint: ask for the requeue; SLURM's SIGTERM stops us
            self.requested = True
            if self._global_zero:
                requeue_now()
            return
        self._signum = signum  # nothing else: the rank may be anywhere, even inside a collective

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        # Between optimizer steps only: gradients accumulated so far would not be in the checkpoint.
        if not self._active or trainer.fit_loop.epoch_loop._should_accumulate():
            return
        if not trainer.strategy.reduce_boolean_decision(self._signum is not None, all=False):
            return
        signum = self._signum or signal.SIGUSR1  # a rank the signal has not reached (yet)
        trainer._logger_connector.update_train_step_metrics()  # this step's row, before the loggers finish
        trainer._signal_connector._slurm_sigusr_handler_fn(signum, None)  # Lightning's requeue
        self._signum, self.requested = None, True
        self._stop_when_slurm_terminates(trainer)

    def _stop_when_slurm_terminates(self, trainer: L.Trainer) -> None:
        """Wait (outside any collective) for the requeue's SIGTERM, then stop as Lightning does."""
        deadline = time.monotonic() + self.sigterm_wait_s
        while time.monotonic() < deadline:
            if sigterm_received(trainer):
                rank_zero_info("SLURM is requeueing the job; it resumes from the hpc checkpoint")
                raise SIGTERMException()
            time.sleep(0.05)
        self.requested = False  # no requeue came: a later SIGTERM (the time limit) ends the run unfinished
        rank_zero_warn(f"no SIGTERM within {self.sigterm_wait_s:.0f}s of the requeue request: training "
                       "continues (was the job submitted with --requeue?)")


def requeue_now(why: str = "requeue signal during the final evaluation",
                then: str = "the next attempt evaluates again from last.ckpt") -> None:
    """`scontrol requeue` this job (this array task), as Lightning's handler does."""
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    job_id = f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array_job else os.environ["SLURM_JOB_ID"]
    rank_zero_info(f"{why}: requeueing SLURM job {job_id} ({then})")
    result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True)
    if result.returncode != 0:
        rank_zero_warn(f"scontrol requeue {job_id} failed: {result.stderr.strip()}")
