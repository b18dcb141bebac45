"""The loggers of a run, configured in one place, and what the rest of the code logs through them.

`build_loggers` makes a run's CSV logger (metrics_csv.py: ``metrics.csv``, kept across resumed
attempts) and, unless disabled, its W&B logger (wandb_run.py: fail-safe, with provenance). W&B is
offline unless online mode is asked for (config, ``WANDB_MODE``) or an API key is available, and it
is a second copy of what the run directory holds, so its failures are warnings, never fatal. The
helpers below log samples, summaries, line plots and images to whichever of them can show them.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger, WandbLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from relpos_lab.config.schema import LOG_CHECKPOINTS, WandbConfig
from relpos_lab.records.metrics_csv import (
    METRICS,
    VALID_PREFIX,
    RunCSVLogger,
    before_checkpoint,
    cut_metrics,
    read_metric_rows,
)
from relpos_lab.records.provenance import provenance
from relpos_lab.records.wandb_run import (
    WANDB_ID,
    RunWandbLogger,
    new_wandb_run_id,
    resolve_wandb_mode,
    resume_plan,
    server_unreachable,
    start_wandb_lineage,
    sync_command,
    wandb_resume_plan,
    wandb_run_id,
)


def build_loggers(cfg: DictConfig, run_dir: str | Path, resume_step: int | None = None,
                  echo: Callable[[str], None] | None = None, quiet: bool = False) -> list[Logger]:
    """The loggers of a run: CSV into ``run_dir/metrics.csv`` first, then W&B (unless disabled).

    CSV comes first because Lightning takes its default checkpoint and log directory from the
    first logger, which makes them ``run_dir/checkpoints`` and ``run_dir``. If W&B cannot even be
    set up (not installed, bad settings) the run goes on with CSV alone and a warning.
    `resume_step`: the global step a resumed fit continues from; its W&B run continues as
    ``logging.wandb.resume`` says, and rows an interrupted attempt's W&B file lost are logged again
    from metrics.csv (`wandb_resume_plan`; `echo` says how many). `quiet`: W&B prints nothing of its own (its
    banner and closing history); its failures still reach the console as warnings (RunWandbLogger).
    """
    run_dir = Path(run_dir)
    loggers: list[Logger] = [RunCSVLogger(run_dir)]
    wandb_logger = _wandb_logger(cfg, run_dir, resume_step, echo, quiet)
    return loggers + ([wandb_logger] if wandb_logger is not None else [])


def _wandb_logger(cfg: DictConfig, run_dir: Path, resume_step: int | None, echo: Callable[[str], None] | None,
                  quiet: bool) -> Logger | None:
    """The run's W&B logger, in the mode it can have here; None when disabled or when W&B cannot be
    set up at all (a warning: the run goes on with CSV)."""
    mode = _wandb_mode(cfg, run_dir, echo)
    if mode == "disabled":
        return None
    plan = None if resume_step is None else wandb_resume_plan(run_dir, resume_step)
    backfill = plan.backfill if plan else []
    if backfill and echo is not None and rank_zero_only.rank == 0:
        echo(f"W&B: the history lacks steps {backfill[0][0]}-{backfill[-1][0]} (an interrupted attempt's W&B file "
             f"ended early); logging its {len(backfill)} rows again from metrics.csv")
    wandb_cfg = OmegaConf.select(cfg, "logging.wandb", default=None) or {}
    seed = OmegaConf.select(cfg, "seed", default=None)
    try:
        return RunWandbLogger(
            **_wandb_identity(cfg, wandb_cfg, run_dir),
            # absolute: a W&B service started by an earlier run of the process (in another
            # working directory) resolves a relative one against its own
            save_dir=os.path.abspath(run_dir),
            id=start_wandb_lineage(run_dir) if rank_zero_only.rank == 0 else wandb_run_id(run_dir),
            name=run_dir.name + (f"-seed{seed}" if seed is not None else ""),
            entity=wandb_cfg.get("entity"),  # None: WANDB_ENTITY, then the key's default entity
            job_type=OmegaConf.select(cfg, "task.name", default=None),
            mode=mode,
            resume=plan,
            rewind=wandb_cfg.get("resume") == "rewind",
            log_model=LOG_CHECKPOINTS[wandb_cfg.get("log_checkpoints") or "none"],
            settings={"init_timeout": float(OmegaConf.select(cfg, "logging.wandb.init_timeout", default=30.0)),
                      **({"silent": True} if quiet else {})},
        )
    except Exception as err:  # e.g. ModuleNotFoundError when wandb is not installed
        warnings.warn(f"W&B logging is off ({type(err).__name__}: {err}); the run continues with CSV only")
        return None


def _wandb_mode(cfg: DictConfig, run_dir: Path, echo: Callable[[str], None] | None) -> str:
    """logging.wandb.mode resolved, and online turned offline (said once) when the server is unreachable."""
    mode = resolve_wandb_mode(OmegaConf.select(cfg, "logging.wandb.mode", default="auto"))
    if mode == "online" and (unreachable := server_unreachable()) is not None:
        mode = "offline"
        if rank_zero_only.rank == 0:
            (echo or print)(f"W&B: {unreachable}; logging offline to {run_dir / 'wandb'} "
                            f"(to sync later: {sync_command(run_dir)})")
    return mode


def _wandb_identity(cfg: DictConfig, wandb_cfg, run_dir: Path) -> dict:
    """Where the run files in W&B (project, group, tags) and the config it carries. W&B's own
    variables (WANDB_PROJECT, WANDB_RUN_GROUP, WANDB_TAGS) stand where the config keeps its default."""
    name = OmegaConf.select(cfg, "name", default=None)
    group = _or_environment(wandb_cfg.get("group"), None, "WANDB_RUN_GROUP") or name
    labels = dict(wandb_cfg.get("labels") or {})
    return {"project": _or_environment(wandb_cfg.get("project"), WandbConfig.project, "WANDB_PROJECT"),
            "group": group,
            "tags": list(wandb_cfg.get("tags") or []) or [t for t in os.environ.get("WANDB_TAGS", "").split(",") if t],
            "run_config": {**OmegaConf.to_container(cfg, resolve=True), **provenance(run_dir),
                           **({"sweep": {"name": name, "group": group, **labels}} if labels else {})}}


def close_loggers(loggers: Iterable[Logger]) -> None:
    """Finish the W&B run(s) of `loggers` at the end of a command (fit, test and all).

    Interpreter exit would also finish them; closing explicitly lets one process run several
    experiments one after another (a local sweep, the tests) with each W&B run complete.
    """
    for logger in loggers:
        if isinstance(logger, RunWandbLogger):
            logger.close()



def log_samples(
    loggers: Iterable[Logger], key: str, columns: list[str], rows: list[list[Any]], step: int | None = None
) -> None:
    """Log sample predictions as a W&B table under `key`; nothing without W&B, and never raises.

    Looking at a handful of inputs, targets and predictions is how one catches a model that
    copies instead of reversing; it is a convenience, so a failure here is only a warning.
    """
    for logger in _wandb_loggers(loggers):
        try:
            logger.log_table(key, columns=list(columns), data=[list(row) for row in rows], step=step)
        except Exception as err:
            warnings.warn(f"W&B: could not log the sample table {key!r} ({type(err).__name__}: {err})")



def _or_environment(configured: Any, default: Any, variable: str) -> Any:
    """`configured`, unless it is the config's default and W&B's environment `variable` is set."""
    if configured in (None, default) and os.environ.get(variable):
        return os.environ[variable]
    return configured if configured is not None else default


def log_summary(loggers: Iterable[Logger], values: Mapping[str, Any]) -> None:
    """Set the W&B run summary (what W&B's run table shows) to `values`, the final evaluation's
    numbers; nothing without W&B, never raises.

    W&B's summary is otherwise the last value logged of each metric: for valid/ that is the last
    validation of the fit, not the checkpoint results.json evaluated (its validation was logged at
    its own step)."""
    for logger in _wandb_loggers(loggers):
        try:
            logger.experiment.summary.update(dict(values))
        except Exception as err:
            warnings.warn(f"W&B: could not set the run summary ({type(err).__name__}: {err})")



def log_line_plot(loggers: Iterable[Logger], key: str, curves: Mapping[str, Mapping], x: str, y: str,
                  title: str) -> None:
    """Log `{line: {x: y}}` as a W&B line plot (with its table, editable in the UI); never raises."""
    for logger in _wandb_loggers(loggers):
        try:
            import wandb

            rows = [[line, int(at), float(v)] for line, pts in curves.items() for at, v in pts.items()]
            table = wandb.Table(columns=["split", x, y], data=rows)
            chart = wandb.plot.line(table, x=x, y=y, stroke="split", title=title)
            logger.log_metrics({key: chart})
        except Exception as err:
            warnings.warn(f"W&B: could not log the line plot {key!r} ({type(err).__name__}: {err})")



def log_images(loggers: Iterable[Logger], images: Mapping[str, str | Path], step: int | None = None) -> None:
    """Log PNG files as W&B images, `{key: path}`, in one history row at training step `step`;
    nothing without W&B, never raises."""
    for logger in _wandb_loggers(loggers):
        try:
            import wandb

            logger.log_metrics({key: wandb.Image(str(path)) for key, path in images.items()}, step=step)
        except Exception as err:
            warnings.warn(f"W&B: could not log {len(images)} images ({type(err).__name__}: {err})")



def _wandb_loggers(loggers: Iterable[Logger]) -> list[WandbLogger]:
    return [lg for lg in loggers if isinstance(lg, WandbLogger) and not getattr(lg, "failed", False)]


__all__ = [  # metrics_csv's and wandb_run's names too: loggers.py is where the run's code finds them
    "METRICS", "VALID_PREFIX", "WANDB_ID", "RunCSVLogger", "RunWandbLogger", "before_checkpoint", "build_loggers",
    "close_loggers", "cut_metrics", "log_images", "log_line_plot", "log_samples", "log_summary", "new_wandb_run_id",
    "read_metric_rows", "resolve_wandb_mode", "resume_plan", "wandb_resume_plan", "wandb_run_id",
]
