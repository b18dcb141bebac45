"""Running an experiment: train a config into its run directory, or evaluate a checkpoint.

These are the verbs behind `relpos-lab train` and `relpos-lab eval`, kept apart from the CLI so
sweeps and launchers can call them in-process. A run's directory is a function of its config
(records.rundir.run_directory), which is what makes ``resume=true`` (or a requeued job) continue in
place from ``checkpoints/last.ckpt``.

The last training step is always validated (final_validation.py), so the best checkpoint (by the
task's main metric on "valid") is the best of every validated step, the last one included. After
training, that checkpoint (or last.ckpt, with ``trainer.evaluate=last``) is evaluated on valid and
test with the same `Task.evaluate` as validation; per-length plots are drawn, then, for a model
with a relative scheme and unless ``logging.inspect=false``, inspect.py draws its attention by
offset and its scheme; the W&B run is closed, and last of all results.json is written (it names the
checkpoint and its step, with per-length numbers). results.json marks the run finished, so it comes
last: a signal before it leaves the run resumable, and the next attempt finishes it (finishing.py).
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback, EarlyStopping, LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from relpos_lab.api import registry
from relpos_lab.api.errors import UserError, shown_path
from relpos_lab.api.evaluation import EvalResult, length_generalization
from relpos_lab.api.files import atomic_write
from relpos_lab.api.task import Task
from relpos_lab.records.loggers import WANDB_ID, build_loggers, close_loggers, cut_metrics, log_summary
from relpos_lab.records.results import plot_by_length, results_text
from relpos_lab.records.rundir import discard_untrained_attempt, has_attempt, save_resolved_config, writable_directory
from relpos_lab.records.runlock import LOCK, run_lock
from relpos_lab.training.checkpoints import (
    CHECKPOINTS,
    LAST,
    OVERRIDES_FIX,
    check_weights_fit,
    global_step_of,
    load_checkpoint,
    resume_checkpoint,
    task_from_checkpoint,
)
from relpos_lab.training.data import TaskDataModule
from relpos_lab.training.final_validation import ValidateLastStep
from relpos_lab.training.finishing import Finishing, deliver_test_signal
from relpos_lab.training.inspect import can_inspect, has_relative_positions, inspect_model
from relpos_lab.training.interrupt import SIGNAL_NAMES, InterruptCheckpoint, sigterm_exit, sigterm_received
from relpos_lab.training.module import TASK_STATE, RelposModule
from relpos_lab.training.planning import RunSummary, plan_run, training_directory
from relpos_lab.training.progress import is_quiet
from relpos_lab.training.requeue import DeferredRequeue, requeue_now
from relpos_lab.training.threads import use_cpu_threads
from relpos_lab.training.trainer import build_trainer, check_hardware

ModuleBuilder = Callable[[DictConfig, Task], RelposModule]

OUTPUTS = "outputs"  # <run dir>/outputs/<split>.<name>: an evaluation's text, one line per example

# Synthetic data lives in memory, so loading in the main process is the fast choice.
warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
# Lightning 2.6 calls a pytree API that torch 2.13 deprecates; nothing a user can act on.
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")


def train(cfg: DictConfig, echo: Callable[[str], None] = print, force: bool = False,
          started: float | None = None, build_module: ModuleBuilder = RelposModule) -> RunSummary:
    """Fit `cfg` in its run directory, evaluate the best checkpoint, write results and plots.

    The one rule for a run directory that already holds an attempt (README, "Time limits, preemption
    and resuming"): a finished run
    (results.json) is reported, not trained; an interrupted one continues from its newest readable
    checkpoint, unless ``resume=false`` (then nothing is touched and the error names ``--force``);
    an attempt interrupted before its first checkpoint is moved aside and the run starts over.
    `force` starts over in any case, moving the old directory aside to ``<run dir>.old-<time>``.
    `started`: when this attempt began (time.time()), by default now; `relpos-lab train` and a sweep's
    point give their process's start, so results.json's `wall_seconds` is the attempt's process time
    up to its results, the time `relpos-lab sweep` says a point took. `build_module(cfg, task)`: the
    LightningModule, RelposModule by default (a stacked run's member replays the stack's weights in one).
    """
    started = time.time() if started is None else started
    check_hardware(cfg)
    use_cpu_threads(cfg.trainer.threads, cfg.trainer.devices)
    run_dir, extending = training_directory(cfg, force)
    new = [d for d in (run_dir, *run_dir.parents[:2]) if not d.exists()]  # made by this command
    fresh = False  # this command trains the run from scratch: whatever its attempt leaves is its own
    try:
        with run_lock(run_dir):
            plan = plan_run(cfg, run_dir, force, echo, extending)
            if isinstance(plan, RunSummary):
                return plan
            if plan != "start over":
                fresh = plan is None
                return _train(cfg, run_dir, started, echo, plan, build_module)
        new, fresh = [run_dir], True
        with run_lock(run_dir):  # the new, empty directory: a W&B run of its own (start_wandb_lineage)
            return _train(cfg, run_dir, started, echo, None, build_module)
    except BaseException as err:
        if rank_zero_only.rank == 0:
            if fresh:  # failed before its first logged step: the next attempt starts here, not beside it
                discard_untrained_attempt(run_dir)
            _remove_unused(new)
        if isinstance(err, OSError) and _unwritable_run(err, run_dir):
            raise UserError(_unwritable(err, run_dir)) from None
        raise


# A run directory that cannot be written: a full disk or quota, a read-only file system (wherever
# the write was), or permissions, a file where a directory should be (on the run directory's path).
FULL = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}
DENIED = {errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EEXIST}


def _unwritable_run(err: OSError, run_dir: Path) -> bool:
    if err.errno in FULL:
        return True
    if err.errno not in DENIED or not err.filename:
        return False
    path, run = Path(os.path.abspath(err.filename)), Path(os.path.abspath(run_dir))
    return path == run or run in path.parents or path in run.parents


def _unwritable(err: OSError, run_dir: Path) -> str:
    """One line: what could not be written, why, and what is safe (the newest checkpoint is written
    atomically, so a failed write leaves the one before intact)."""
    path = shown_path(err.filename) if err.filename else shown_path(run_dir)
    newest = resume_checkpoint(run_dir, warn=lambda _: None) if run_dir.is_dir() else None
    room = ""
    if err.errno in FULL and err.errno != errno.EROFS and run_dir.is_dir():  # how much room it takes
        free = shutil.disk_usage(run_dir).free
        room = f" ({_megabytes(free)} free" + (f"; a checkpoint takes {_megabytes(newest.stat().st_size)}"
                                                if newest else "") + ")"
    kept = (f"the newest checkpoint, {shown_path(newest)} (step {global_step_of(newest)}), is intact: "
            "make room (or make it writable) and run the same command to resume from it"
            if newest else "no checkpoint was written: make room (or make it writable) and run the same command")
    return f"cannot write {path}: {err.strerror or err}{room}; {kept}"


def _megabytes(size: int) -> str:
    return f"{size / 2**20:.1f} MB"


def _remove_unused(directories: list[Path]) -> None:
    """Remove the directories this command made when it failed before training wrote anything (a
    config error found while setting up): what is left is the lock, the config, a W&B run id."""
    for directory in directories:  # innermost first
        if not directory.is_dir() or has_attempt(directory):
            return
        for name in (LOCK, "config.yaml", WANDB_ID):
            (directory / name).unlink(missing_ok=True)
        try:
            directory.rmdir()
        except OSError:  # something else is in it: keep it
            return


def _train(cfg: DictConfig, run_dir: Path, started: float, echo: Callable[[str], None],
           resume_from: Path | None, build_module: ModuleBuilder = RelposModule) -> RunSummary:
    """Fit, evaluate the chosen checkpoint, then write what a finished run holds (results.json last)."""
    resume_step = global_step_of(resume_from) if resume_from is not None else None
    task, module = task_and_module(cfg, run_dir, resume_from, build_module)  # may refuse the config first
    _echo(echo, f"Run directory: {run_dir}" + (f" (resuming from {resume_from.name})" if resume_from else ""))
    if resume_step is not None and rank_zero_only.rank == 0:
        cut = cut_metrics(run_dir, resume_step)
        if cut:
            echo(f"metrics.csv: cut back to step {resume_step}, the checkpoint's ({cut} rows the interrupted attempt "
                 "logged after it are trained again)")
    data = TaskDataModule(task, cfg.data)
    watch = _Callbacks.build(cfg, run_dir, task)
    loggers = build_loggers(cfg, run_dir, resume_step=resume_step, echo=echo, quiet=is_quiet())
    try:
        trainer = build_trainer(cfg, run_dir, loggers=loggers, callbacks=watch.all)
        _rank_zero(save_resolved_config, cfg, run_dir)
        _fit(trainer, module, data, resume_from, watch, run_dir, echo)
        checkpoint, choice = _final_evaluation(cfg, trainer, module, data, watch, run_dir, echo)
        extra = {"task": task.cfg.name, "checkpoint": _relative(checkpoint, run_dir),
                 "checkpoint_step": global_step_of(checkpoint), "checkpoint_choice": choice,
                 "global_step": trainer.global_step,
                 "started_at_step": trainer.global_step if module.start_step is None else module.start_step,
                 "main_metric": f"valid/{task.main_metric}", "seed": cfg.seed,
                 "train_lengths": list(task.train_length_range() or []) or None,
                 "parameters": sum(p.numel() for p in module.model.parameters()),
                 "wall_seconds": None,  # this attempt's, from `started` to its results: set as they are written
                 **module.results_notes()}
        summary = _finish(cfg, trainer, module, task, loggers, watch.requeue, run_dir, extra, echo, started)
    finally:
        close_loggers(loggers)
    summary.checkpoint, summary.resumed_from, summary.seconds = checkpoint, resume_from, time.time() - started
    summary.checkpoint_step, summary.checkpoint_choice = extra["checkpoint_step"], choice
    return summary


def task_and_module(cfg: DictConfig, run_dir: Path, resume_from: Path | None,
                    build_module: ModuleBuilder = RelposModule) -> tuple[Task, RelposModule]:
    """The task (with the vocabulary a checkpoint was trained with) and the module, its model
    initialised from the run's seed; a resumed run's checkpoint is checked against the module before
    anything in the run directory changes."""
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    task = registry.create_task(OmegaConf.to_object(cfg.task), seed=cfg.seed)
    if resume_from is not None:
        state = load_checkpoint(resume_from)
        task.load_state_dict(state.get(TASK_STATE) or {})
    module = build_module(cfg, task)
    if resume_from is not None:  # before metrics.csv is cut back and W&B logs rows again
        check_weights_fit(resume_from, state, module, cfg, RESUME_FIX.format(old=f"{run_dir.name}.old-<time>"))
    return task, module


@dataclass
class _Callbacks:
    """The training callbacks the run consults afterwards, and all of them for the Trainer.

    best-step=N.ckpt by the task's main metric; last.ckpt every N steps from a second callback
    (Lightning writes `save_last` of a monitoring callback only when the best improves). SLURM:
    checkpoint + requeue on SIGUSR1; Ctrl-C / SIGTERM: checkpoint + stop; every N minutes: checkpoint.
    """

    best: ModelCheckpoint
    guard: InterruptCheckpoint
    final: ValidateLastStep  # the last step is validated too, before the best is chosen
    requeue: DeferredRequeue
    all: list[Callback]

    @classmethod
    def build(cls, cfg: DictConfig, run_dir: Path, task: Task) -> "_Callbacks":
        best = ModelCheckpoint(dirpath=run_dir / CHECKPOINTS, filename="best-{step}",
                               monitor=f"valid/{task.main_metric}", mode=task.main_metric_mode, save_top_k=1)
        last = ModelCheckpoint(dirpath=run_dir / CHECKPOINTS, save_top_k=0, save_last=True,
                               enable_version_counter=False,
                               every_n_train_steps=(cfg.trainer.checkpoint_every_n_steps
                                                    or cfg.trainer.val_every_n_steps))
        guard = InterruptCheckpoint(run_dir / CHECKPOINTS / LAST, cfg.trainer.checkpoint_every_minutes)
        final, requeue = ValidateLastStep(), DeferredRequeue()
        callbacks: list[Callback] = [final, best, last, requeue, guard, LearningRateMonitor(logging_interval="step")]
        if cfg.trainer.stop_at is not None:  # train until converged on valid, max_steps the cap
            callbacks.append(EarlyStopping(monitor=f"valid/{task.main_metric}", mode=task.main_metric_mode,
                                           stopping_threshold=cfg.trainer.stop_at, patience=2**31,
                                           check_on_train_epoch_end=False))
        return cls(best, guard, final, requeue, callbacks)


def _fit(trainer: L.Trainer, module: RelposModule, data: TaskDataModule, resume_from: Path | None,
         watch: _Callbacks, run_dir: Path, echo: Callable[[str], None]) -> None:
    """Train to max_steps; a signal stops it with a checkpoint and the exit status it calls for. Then
    last.ckpt holds the last step and its validation."""
    guard, requeue = watch.guard, watch.requeue
    try:
        trainer.fit(module, datamodule=data, ckpt_path=resume_from, weights_only=False)
    except (KeyboardInterrupt, SystemExit):  # Lightning ends a Ctrl-C with sys.exit(1)
        if guard.stopped_by is None:
            raise
        _echo(echo, _stopped(run_dir, guard.stopped_by, trainer.global_step, requeue.requested))
        if guard.stopped_by == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise sigterm_exit(requeue.requested) from None
    last_path = run_dir / CHECKPOINTS / LAST
    # After the steps since the last periodic save, or after the last step's validation (a
    # save at that step came before it): last.ckpt records the validation, so a run resumed
    # from it does not validate that step again.
    if global_step_of(last_path) != trainer.global_step or watch.final.validated_step == trainer.global_step:
        trainer.save_checkpoint(last_path, weights_only=False)
    if guard.pending is not None:  # a signal during the last validation: training is complete and saved
        _echo(echo, _stopped(run_dir, guard.pending, trainer.global_step, requeue.requested)
              + " (training is complete; the final evaluation was not run)")
        raise KeyboardInterrupt if guard.pending == signal.SIGINT else sigterm_exit(requeue.requested)
    # resumed from a checkpoint of the last step written before its validation: validate it now
    if watch.final.validate_if_missed(trainer, module, data, watch.best, last_path):
        trainer.save_checkpoint(last_path, weights_only=False)


def _final_evaluation(cfg: DictConfig, trainer: L.Trainer, module: RelposModule, data: TaskDataModule,
                      watch: _Callbacks, run_dir: Path, echo: Callable[[str], None]) -> tuple[Path, str]:
    """Validate and test the checkpoint trainer.evaluate chooses (the best validated step, or the
    last); returns it and the choice. SIGTERM stops it: the next attempt evaluates again."""
    choice = "best" if cfg.trainer.evaluate == "best" and watch.best.best_model_path else "last"
    checkpoint = Path(watch.best.best_model_path) if choice == "best" else run_dir / CHECKPOINTS / LAST
    module.unlogged.add("valid")  # logged at its step when it was validated
    module.evaluated_step = global_step_of(checkpoint)  # test/* is logged at the step it measured
    requeue = watch.requeue
    deliver_test_signal("evaluate", lambda: requeue.requested or sigterm_received(trainer))
    try:
        trainer.validate(module, datamodule=data, ckpt_path=checkpoint, verbose=False, weights_only=False)
        trainer.test(module, datamodule=data, ckpt_path=checkpoint, verbose=False, weights_only=False)
    except SIGTERMException:  # Lightning's evaluation loop stops at the next batch
        if not requeue.requested:
            _echo(echo, _stopped(run_dir, signal.SIGTERM, trainer.global_step) + " (training is complete; the "
                  "final evaluation was not run)")
        raise sigterm_exit(requeue.requested) from None
    return checkpoint, choice


def _finish(cfg: DictConfig, trainer: L.Trainer, module: RelposModule, task: Task, loggers: list,
            requeue: DeferredRequeue, run_dir: Path, extra: dict, echo: Callable[[str], None],
            started: float) -> RunSummary:
    """Write what a finished run holds, results.json last: a signal before it leaves the run
    unfinished and resumable, and the next attempt completes it (finishing.py). Its wall_seconds
    run from `started` to then, the plots, inspect's figures and closing W&B included."""
    splits = {"valid": module.results["valid"], "test": module.results["test"]}
    checkpoint = run_dir / extra["checkpoint"]
    with Finishing(requeue.signum, requeue_now, requeue.requested, echo=echo) as finishing:
        if not trainer.is_global_zero:  # other ranks of a distributed run write nothing
            return RunSummary(run_dir, run_dir / "results.json", {}, checkpoint=checkpoint,
                              checkpoint_step=extra["checkpoint_step"], checkpoint_choice=extra["checkpoint_choice"])
        finishing.step("outputs")
        summary, results = _write(run_dir, splits, task, loggers, extra)
        finishing.step("summary")  # W&B's run table: the evaluated checkpoint's numbers, as results.json
        log_summary(loggers, evaluated_summary(summary.metrics, extra["checkpoint_choice"], extra["checkpoint_step"]))
        finishing.step("inspect")
        if (OmegaConf.select(cfg, "logging.inspect", default=True) and has_relative_positions(module.model)
                and can_inspect(task)):  # after every metric: they cannot change
            inspect_model(module.model, task, cfg, run_dir, loggers=loggers, echo=echo, step=trainer.global_step)
        finishing.step("wandb")
        close_loggers(loggers)  # the W&B run's file complete: its last steps and test rows
        finishing.step("results")
        for requeue_checkpoint in run_dir.glob("hpc_ckpt_*.ckpt"):  # a finished run is carried by last/best
            requeue_checkpoint.unlink(missing_ok=True)
        atomic_write(summary.results, _timed(results, started))
    return summary


def _timed(results: str, started: float) -> str:
    """results.json's text with its wall_seconds up to now."""
    payload = json.loads(results)
    payload["wall_seconds"] = round(time.time() - started, 1)
    return json.dumps(payload, indent=2, allow_nan=False) + "\n"


def evaluated_summary(metrics: dict, choice: str, step: int | None) -> dict:
    """The W&B summary keys of the evaluated checkpoint: results.json's numbers under best/ (or final/
    under trainer.evaluate=last) with that checkpoint's step, beside the history's own last values
    (valid/loss there is the fit's last validation, whose step the charts end at)."""
    prefix = "best" if choice == "best" else "final"
    return {f"{prefix}/{name}": value for name, value in metrics.items()} | {f"{prefix}/step": step}


RESUME_FIX = ("Continue the run with the code and config its checkpoint was trained with, or pass --force to start "
              "over (the run directory is moved to {old}). Nothing in the run directory was changed")
EVAL_FIX = OVERRIDES_FIX + ". Nothing was written"


def _stopped(run_dir: Path, signum: int, step: int, requeued: bool = False) -> str:
    """Where an interrupted run stands: its newest checkpoint and how it continues (`requeued`: SLURM
    runs its next attempt; nothing for the user to do)."""
    newest = resume_checkpoint(run_dir, warn=lambda _: None)
    if requeued:
        return (f"SLURM requeues the job at step {step}: its next attempt resumes from "
                + (f"{shown_path(newest)} (step {global_step_of(newest)})." if newest else "the start."))
    if newest is None:
        return (f"Stopped by {SIGNAL_NAMES.get(signum, signum)} at step {step}, before the first checkpoint: "
                "nothing to resume from; the same command starts over.")
    again = ("if SLURM requeues the job (scontrol requeue), its next attempt resumes from it; else resubmit "
             "to resume" if os.environ.get("SLURM_JOB_ID") else "run the same command again to resume from it")
    return (f"Stopped by {SIGNAL_NAMES.get(signum, signum)} at step {step}. Newest checkpoint: {shown_path(newest)} "
            f"(step {global_step_of(newest)}); {again}.")


def evaluate(checkpoint: str | Path, split: str = "test", overrides: list[str] = (),
             output: str | Path | None = None) -> RunSummary:
    """Evaluate a checkpoint on one split with the same `Task.evaluate` as validation.

    The config comes from the checkpoint (overrides apply on top, e.g. longer test lengths).
    Results go to `output`, by default ``<run dir>/eval/<checkpoint>-<split>[-<hash of the
    overrides>]/``, with the config that ran: evaluations with other overrides do not overwrite it.
    """
    started = time.time()
    checkpoint = Path(checkpoint)
    state = load_checkpoint(checkpoint)
    cfg, task = task_from_checkpoint(checkpoint, overrides, state)
    use_cpu_threads(cfg.trainer.threads)  # one process: evaluation runs on a single device
    task.check_split(split)
    out_dir = Path(output) if output else _eval_directory(checkpoint, split, overrides)
    module = RelposModule(cfg, task, test_split=split)
    check_weights_fit(checkpoint, state, module, cfg, EVAL_FIX)
    writable_directory(out_dir, "give another directory for the results with --output DIR. Nothing was evaluated")
    data = TaskDataModule(task, cfg.data, test_split=split)
    single = OmegaConf.merge(cfg, {"trainer": {"devices": 1, "num_nodes": 1, "strategy": "auto"}})
    trainer = build_trainer(single, out_dir, loggers=[], callbacks=[])
    trainer.test(module, datamodule=data, ckpt_path=checkpoint, verbose=False, weights_only=False)
    save_resolved_config(cfg, out_dir)
    step = state.get("global_step")
    summary, results = _write(out_dir, {split: module.results[split]}, task, [],
                              {"task": task.cfg.name, "checkpoint": str(checkpoint), "checkpoint_step": step,
                               "split": split, "overrides": list(overrides)})
    atomic_write(summary.results, results)
    summary.checkpoint, summary.checkpoint_step, summary.seconds = checkpoint, step, time.time() - started
    return summary


def _eval_directory(checkpoint: Path, split: str, overrides: list[str]) -> Path:
    """<run dir>/eval/<checkpoint>-<split>[-<hash>]; hpc_ckpt_N.ckpt sits in the run dir itself."""
    checkpoint = checkpoint.resolve()
    run_dir = checkpoint.parent.parent if checkpoint.parent.name == CHECKPOINTS else checkpoint.parent
    name = f"{checkpoint.stem}-{split}"
    if overrides:
        name += "-" + hashlib.sha256("\n".join(overrides).encode()).hexdigest()[:8]
    return run_dir / "eval" / name


def _write(out_dir: Path, splits: dict[str, EvalResult], task, loggers, extra: dict) -> tuple[RunSummary, str]:
    """Write an evaluation's outputs/ and plots/; return its summary and results.json's text (checked
    first, written by the caller last: a results.json marks the evaluation complete)."""
    metrics = {f"{split}/{k}": v for split, r in splits.items() for k, v in r.metrics.items()}
    by_length = {split: r.by_length for split, r in splits.items() if r.by_length}
    for split, rows in by_length.items():
        summary = length_generalization(rows, task.train_length_range())
        metrics.update({f"{split}/{k}": v for k, v in summary.items()})
    details = {split: r.details for split, r in splits.items() if r.details}
    if details:
        extra = {**extra, "details": details}
    results = results_text(metrics, by_length or None, extra)
    outputs = [_write_lines(out_dir / OUTPUTS / f"{split}.{name}", lines)
               for split, r in splits.items() for name, lines in (r.outputs or {}).items()]
    curves = {split: {n: {k: v for k, v in row.items() if k != "n"} for n, row in rows.items()}
              for split, rows in by_length.items()}  # example counts are not worth a plot
    plots = plot_by_length(out_dir, curves, task.train_length_range(), loggers) if by_length else []
    return RunSummary(out_dir, out_dir / "results.json", metrics, plots, outputs, details=details), results


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


@rank_zero_only
def _rank_zero(fn, *args) -> None:
    fn(*args)


@rank_zero_only
def _echo(echo: Callable[[str], None], message: str) -> None:
    echo(message)
