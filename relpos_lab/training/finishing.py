"""Finishing a run without a signal leaving it half-finished: results.json is written last.

A run directory holding results.json is finished: the next attempt reports it and trains nothing
(planning.plan_run). So results.json must not exist before everything else finishing leaves is
written: outputs/, plots/ (and their W&B line plots), the W&B summary, inspect's drawings, and
the W&B run closed with its offline file complete (the test rows and the last steps). Finishing
therefore runs as named steps (STEPS) and writes results.json, atomically, as the last one.

A signal during finishing must either let it complete or leave the run resumable. `Finishing`
holds SIGTERM and SLURM's requeue signal (SIGUSR1) for the steps after the final evaluation:
they only note the signal, so no step is cut in half (a PNG half written, W&B's file closed
mid-record), and the next step boundary acts on it: the attempt stops before results.json, with
SLURM asked for the requeue first when the signal was the requeue signal. Then last.ckpt holds
the finished training, so the next attempt's fit ends at once and it evaluates and finishes
again (the rows this attempt logged after the checkpoint are cut from metrics.csv and rewound
in W&B, as for any resume). Once results.json is written the run is finished: a signal after
that changes nothing, and the requeue signal is ignored for the rest of the process (there is
nothing to requeue, and the default action would kill the process and, through srun's
--kill-on-bad-exit, the job).

Every rank installs the handlers, not only rank 0, which writes: a requeue signal reaching a
rank with nothing left to write used to kill it ("User defined signal 1"), and srun then killed
rank 0 mid-write.

`SIGNAL_AT` is for tests: ``RELPOS_LAB_SIGNAL_AT=<step>:<SIGNAL>`` delivers SIGNAL as rank 0's
finishing reaches `step` (``done`` is after results.json): to this process, or inside a SLURM job
step to every task of it (``scancel --signal``, as SLURM's own signals arrive).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable

from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from relpos_lab.training.interrupt import sigterm_exit

# In order: the final validate/test, outputs/ and plots/, the W&B summary, inspect's drawings,
# the W&B run closed, results.json; `done` is after it (a signal then must change nothing).
STEPS = ("evaluate", "outputs", "summary", "inspect", "wandb", "results", "done")
SIGNAL_AT = "RELPOS_LAB_SIGNAL_AT"


class FinishingStopped(SIGTERMException):
    """A signal stopped finishing before results.json: the run is resumable, and unfinished."""


class Finishing:
    """A context for finishing's steps: SIGTERM and the requeue signal wait for a step boundary.

    `requeue_signal`: the signal SLURM's auto-requeue listens to (None: not under SLURM, or
    auto-requeue off: the requeue signal is left alone). `requeue`: asks SLURM to requeue the job
    (rank 0 only); `requeued`: whether this attempt already asked for it (during the evaluation).
    `echo` says, on rank 0, why finishing stopped.
    """

    def __init__(self, requeue_signal: int | None, requeue: Callable[[str], None], requeued: bool = False,
                 echo: Callable[[str], None] = print) -> None:
        self.requeue_signal = requeue_signal
        self._requeue, self.requeued, self._echo = requeue, requeued, echo
        self.received: int | None = None  # the first signal noted, not acted on yet
        self._previous: dict[int, object] = {}
        self._signals = [signal.SIGTERM] + ([requeue_signal] if requeue_signal is not None else [])

    def __enter__(self) -> Finishing:
        if threading.current_thread() is threading.main_thread():
            for signum in self._signals:
                self._previous[signum] = signal.signal(signum, self._note)
        return self

    def _note(self, signum: int, _frame) -> None:
        if self.received is None or signum == signal.SIGTERM:  # SIGTERM (a kill, or SLURM's) decides the end
            self.received = signum

    def step(self, name: str) -> None:
        """Finishing reaches `name` (one of STEPS): stop here if a signal came during the step before."""
        assert name in STEPS, name
        deliver_test_signal(name, lambda: self.received is not None)
        if self.received is None and not self.requeued:
            return
        # A requeue asked for during the evaluation stops here too: SLURM is ending this attempt, and
        # Lightning's next loop forgets a SIGTERM that came during the one before.
        signum, step = self.received or self.requeue_signal, name
        if signum == self.requeue_signal and not self.requeued:
            self.requeued = True
            if rank_zero_only.rank == 0:
                self._requeue(f"requeue signal while finishing (before {step})")
        if rank_zero_only.rank == 0:
            self._echo(stopped_while_finishing(signum, step, self.requeued))
        raise FinishingStopped(None if self.requeued else sigterm_exit().code)

    def __exit__(self, kind, error, traceback) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in self._previous.items():
            if error is None and signum == self.requeue_signal:  # finished: nothing is left to requeue
                signal.signal(signum, finished_requeue_signal)
            else:
                signal.signal(signum, previous)
        self._previous = {}
        if error is None:
            deliver_test_signal("done", lambda: True)


def finished_requeue_signal(signum: int, _frame) -> None:
    """The requeue signal after the run finished: nothing to checkpoint or requeue (a no-op handler
    rather than SIG_IGN, which processes started later would inherit)."""


def stopped_while_finishing(signum: int, step: str, requeued: bool) -> str:
    name = signal.Signals(signum).name
    if requeued:
        return (f"{name} while finishing the run (before {step}): training is complete and in last.ckpt; SLURM "
                "requeues the job, and its next attempt evaluates and finishes the run again.")
    return (f"Stopped by {name} while finishing the run (before {step}): training is complete and in last.ckpt, "
            "results.json is not written; run the same command again to evaluate and finish it.")


def deliver_test_signal(step: str, arrived: Callable[[], bool]) -> None:
    """Tests: send the signal `SIGNAL_AT` names when finishing reaches its step (on rank 0), and
    wait (up to 30 s) until it `arrived`: scancel's signal comes a moment after scancel returns."""
    wanted = os.environ.get(SIGNAL_AT, "")
    if not wanted or rank_zero_only.rank != 0:
        return
    at, _, name = wanted.partition(":")
    if at != step:
        return
    signum = signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]
    job, step_id = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID")
    if not (job and step_id and shutil.which("scancel")):
        os.kill(os.getpid(), signum)  # the handler has run when os.kill returns
        return
    subprocess.run(["scancel", f"--signal={signum.name.removeprefix('SIG')}", f"{job}.{step_id}"], check=True,
                   timeout=30)
    deadline = time.monotonic() + 30
    while not arrived() and time.monotonic() < deadline:
        time.sleep(0.05)
