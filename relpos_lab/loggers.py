"""Lightning's CSV and W&B loggers, adjusted so a run directory can be resumed and W&B can fail.

Two behaviours of the stock loggers clash with this project's contracts, and each class below
changes only that behaviour:

- Lightning's CSVLogger deletes an existing ``metrics.csv`` when it starts (it assumes a fresh
  version directory per run). Our run directory is reused when a run resumes, so the earlier rows
  must survive: `RunCSVLogger` appends to the file and keeps its header.
- Lightning's WandbLogger lets any W&B error (no network, a broken install, a crashed wandb-core)
  propagate and kill training. `RunWandbLogger` turns each such error into one warning and goes on
  without W&B. It also puts the resolved config and provenance (git commit, SLURM ids) in the
  W&B run config, finishes the W&B run when a fit fails or SLURM requeues it (so everything
  logged so far is flushed before the process is killed), and never silently logs into another
  run's W&B run.

build_loggers in tracking.py is the one place that configures them.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.utilities.rank_zero import rank_zero_only, rank_zero_warn

from .wandb_offline import wait_until_complete


class _AppendingWriter(ExperimentWriter):
    """Lightning's CSV writer, minus the deletion of an existing metrics file.

    The stock writer knows its column names only from what it logged itself, so it starts from
    the existing file's header: new columns then trigger Lightning's own rewrite-with-new-header
    path, which keeps the old rows.
    """

    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as file:
                self.metrics_keys = next(csv.reader(file), [])


class RunCSVLogger(CSVLogger):
    """CSVLogger that writes exactly ``<run_dir>/metrics.csv`` and appends when it exists.

    Rows logged by an earlier attempt of the same run stay; the ``step`` column tells them apart.
    After a SLURM requeue there is no overlap (the checkpoint is taken at the signal); after a
    hard kill, the steps between the last checkpoint and the kill appear twice, once per attempt.
    """

    def __init__(self, run_dir: str | os.PathLike, flush_logs_every_n_steps: int = 100):
        run_dir = os.path.abspath(os.fspath(run_dir))
        # save_dir/name/version with an empty name puts the files in run_dir itself, and makes
        # Lightning's default checkpoint directory run_dir/checkpoints.
        super().__init__(
            save_dir=os.path.dirname(run_dir),
            name="",
            version=os.path.basename(run_dir),
            flush_logs_every_n_steps=flush_logs_every_n_steps,
        )

    @property
    @rank_zero_experiment
    def experiment(self) -> _AppendingWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment


class _NullRun:
    """Stands in for a W&B run after W&B failed: every attribute and call is a no-op."""

    def __getattr__(self, _name: str) -> _NullRun:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


class RunWandbLogger(WandbLogger):
    """WandbLogger for one run directory: fail-safe, with provenance, one W&B run per run id.

    `run_config` (the resolved config and provenance) is merged into the W&B run config right
    after ``wandb.init`` rather than passed to it, with changes allowed: a resumed run may differ
    in keys such as ``resume`` or the SLURM job id. Extra keyword arguments go to ``wandb.init``
    as in Lightning's WandbLogger.
    """

    def __init__(self, *, run_config: dict[str, Any] | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        if self._wandb_init.get("anonymous") is None:  # wandb 0.31 warns about the key even when None
            self._wandb_init.pop("anonymous", None)
        self._run_config = run_config or {}
        self._failure: str | None = None

    @property
    def failed(self) -> bool:
        """True once W&B raised: the logger then drops everything sent to it."""
        return self._failure is not None

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        if self._failure is not None:
            return _NullRun()
        try:
            if self._experiment is None:
                self._finish_other_run()
                super().experiment.config.update(self._run_config, allow_val_change=True)
            return self._experiment
        except Exception as err:  # any W&B problem must leave training running
            self._fail(f"could not start W&B run {self._id!r}", err)
            return _NullRun()

    @property
    def version(self) -> str | None:
        return self._id if self._failure is not None else super().version

    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        self._guard("log hyperparameters", super().log_hyperparams, params)

    @rank_zero_only
    def log_metrics(self, metrics: Any, step: int | None = None) -> None:
        # log_table, log_text, log_image, ... all go through here.
        self._guard("log metrics", super().log_metrics, metrics, step)

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        self._guard("record a checkpoint", super().after_save_checkpoint, checkpoint_callback)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Finish the W&B run when the process is about to end abnormally.

        Lightning calls finalize("success") after every fit/validate/test; the run stays open
        then, so a test after a fit continues the same W&B run (close() or interpreter exit ends
        it). "failed" (an exception) and "finished" (SLURM's requeue signal) finish it now, because
        the process may be killed before exit handlers run.
        """
        self._guard("finalize", super().finalize, status)
        if status == "finished":
            self.close(preempted=True)
        elif status == "failed":
            self.close(exit_code=1)

    def close(self, exit_code: int = 0, preempted: bool = False) -> None:
        """Finish this logger's W&B run; logging afterwards resumes the same run id."""
        if self._experiment is None or self._failure is not None:
            return
        run, self._experiment = self._experiment, None
        run_file = Path(run.dir).parent / f"run-{run.id}.wandb"
        try:
            if preempted:
                run.mark_preempting()
            run.finish(exit_code=exit_code)
        except Exception as err:
            self._fail("could not finish the W&B run", err)
            return
        if run_file.is_file():  # offline: the run directory is complete when the command returns
            wait_until_complete(run_file)

    def _finish_other_run(self) -> None:
        """Finish a different W&B run left open in this process (an earlier run of a sweep).

        Lightning would log into whatever run is open; our run id is a function of the run
        directory, so writing into another run would mix two experiments.
        """
        import wandb

        if wandb.run is not None and self._id is not None and wandb.run.id != self._id:
            rank_zero_warn(f"finishing W&B run {wandb.run.id!r} left open before starting {self._id!r}")
            wandb.run.finish()

    def _guard(self, action: str, fn: Any, *args: Any) -> None:
        if self._failure is not None:
            return
        try:
            fn(*args)
        except Exception as err:
            self._fail(f"could not {action}", err)

    def _fail(self, action: str, err: Exception) -> None:
        self._failure = f"{type(err).__name__}: {err}"
        self._experiment = None
        rank_zero_warn(
            f"W&B: {action} ({self._failure}); training continues without W&B. "
            "The run directory (metrics.csv, results.json, plots/) has everything logged."
        )
