"""metrics.csv, the run directory's own record of what was logged, kept across resumed attempts.

Lightning's CSVLogger deletes an existing ``metrics.csv`` when it starts (it assumes a fresh
version directory per run). Our run directory is reused when a run resumes, so the earlier rows
must survive: `RunCSVLogger` appends to the file and keeps its header, and `cut_metrics` drops the
rows an interrupted attempt logged after the checkpoint the next attempt resumes from.
"""
from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from relpos_lab.api.files import append_text, atomic_write

METRICS = "metrics.csv"


class _AppendingWriter(ExperimentWriter):
    """Lightning's CSV writer, minus the deletion of an existing metrics file, and safe on a full disk.

    The stock writer knows its column names only from what it logged itself, so it starts from
    the existing file's header: new columns then rewrite the file with the new header, keeping the
    old rows. Lightning truncates the file for that rewrite and appends rows in place, so a disk
    that fills midway loses rows or leaves half of one; here the rewrite is atomic and an append
    is whole or undone.
    """

    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as file:
                self.metrics_keys = next(csv.reader(file), [])

    def save(self) -> None:
        if not self.metrics:
            return
        path = Path(self.metrics_file_path)
        if self._record_new_keys() and path.is_file():
            self._rewrite_with_new_header(self.metrics_keys)
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=self.metrics_keys)
        if not path.is_file():
            writer.writeheader()
        writer.writerows(self.metrics)
        append_text(path, text.getvalue())
        self.metrics = []

    def _rewrite_with_new_header(self, fieldnames: list[str]) -> None:
        with open(self.metrics_file_path, newline="") as file:
            rows = list(csv.DictReader(file))
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows(rows)
        atomic_write(Path(self.metrics_file_path), text.getvalue())


class RunCSVLogger(CSVLogger):
    """CSVLogger that writes exactly ``<run_dir>/metrics.csv`` and appends when it exists.

    Rows logged by an earlier attempt of the same run stay. A resumed attempt first cuts the file
    back to the step of its checkpoint (`cut_metrics`), so the steps an interrupted attempt logged
    after that checkpoint are not there twice.
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

    _flush_next = False

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        """A checkpoint was written: put every row logged so far on disk, and the next one (the
        checkpointed step's own row, logged just after the checkpoint), so that a run killed
        later resumes from the checkpoint without a gap in metrics.csv."""
        self.save()
        self._flush_next = True

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        super().log_metrics(metrics, step)
        if self._flush_next:
            self._flush_next = False
            self.save()


VALID_PREFIX = "valid/"  # a validation's metrics (training/module.py logs them at the validated step)
TEST_PREFIX = "test/"  # the final test's, logged at its checkpoint's step, often before the last one


def before_checkpoint(row_step: int, metrics: Iterable[str], step: int) -> bool:
    """Whether a logged row precedes a checkpoint of global step `step`, so that a fit resumed from
    that checkpoint does not log it again.

    Training rows are logged at Lightning's step, the count of optimizer steps before the batch (the
    g-th step's loss is row g - 1), so a fit resumed at g logs its training rows from g on. A
    validation is logged at the step of the weights it validated (`metrics` holds ``valid/`` keys):
    the validation of step g belongs to the checkpoint of step g, whichever was written first, and
    a resumed fit does not repeat it (the last step of a run is validated once: final_validation.py).
    The final test's row precedes no checkpoint: a resumed (or extended) run tests again.
    """
    metrics = [str(k) for k in metrics]
    if any(k.startswith(TEST_PREFIX) for k in metrics):
        return False
    return row_step < step or (row_step == step and any(k.startswith(VALID_PREFIX) for k in metrics))


def cut_metrics(run_dir: str | Path, step: int) -> int:
    """Drop the rows of ``<run_dir>/metrics.csv`` logged after a checkpoint of global step `step`
    (`before_checkpoint`); return how many.

    They are the interrupted attempt's work after the checkpoint, which the resumed attempt does again.
    """
    path = Path(run_dir) / METRICS
    if not path.is_file():
        return 0
    with open(path, newline="") as file:
        reader = csv.DictReader(file)
        header, rows = reader.fieldnames or [], list(reader)
    keep = [row for row in rows if not (row.get("step") or "").isdigit()
            or before_checkpoint(int(row["step"]), [k for k, v in row.items() if v], step)]
    if len(keep) == len(rows):
        return 0
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=header, lineterminator="\n")
    writer.writeheader()
    writer.writerows(keep)
    atomic_write(path, text.getvalue())
    return len(rows) - len(keep)


def read_metric_rows(run_dir: str | Path) -> list[tuple[int, dict[str, float]]]:
    """The rows of ``<run_dir>/metrics.csv`` as (training step, {metric: value}), empty cells left out."""
    path = Path(run_dir) / METRICS
    if not path.is_file():
        return []
    with open(path, newline="") as file:
        rows = []
        for row in csv.DictReader(file):
            step = row.pop("step", "") or ""
            if step.isdigit():
                rows.append((int(step), {k: int(float(v)) if k == "epoch" else float(v) for k, v in row.items() if v}))
    return rows
