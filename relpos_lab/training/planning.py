"""Where a run trains and from what: its directory, another budget's run to extend, or what its
directory already holds (a finished run, a checkpoint to resume from, an attempt to move aside).

`train` (experiment.py) asks `training_directory` and `plan_run` before anything is trained; the
SLURM launcher asks `training_directory` and `extend_run` before it submits (README, "Time limits,
preemption and resuming").
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from lightning.pytorch.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from relpos_lab.api.errors import PROG, UserError, shown_path
from relpos_lab.api.files import atomic_write
from relpos_lab.records.loggers import cut_metrics
from relpos_lab.records.rundir import (
    BUDGET_KEYS,
    EXTENDED,
    budget_of,
    budget_siblings,
    has_attempt,
    move_aside,
    run_directory,
    saved_config,
)
from relpos_lab.training.checkpoints import global_step_of, resume_checkpoint


@dataclass
class RunSummary:
    """What a command produced, for the CLI's closing summary and for callers such as sweeps."""

    run_dir: Path
    results: Path
    metrics: dict[str, float]
    plots: list[Path] = field(default_factory=list)
    outputs: list[Path] = field(default_factory=list)  # outputs/<split>.<name>: hypotheses, references
    checkpoint: Path | None = None
    checkpoint_step: int | None = None  # the global step of `checkpoint`
    checkpoint_choice: str | None = None  # trainer.evaluate: "best" or "last"
    resumed_from: Path | None = None
    seconds: float = 0.0
    finished_before: bool = False  # the run was finished already: nothing was trained
    details: dict[str, dict[str, str]] = field(default_factory=dict)  # split -> what its numbers were made of


def training_directory(cfg: DictConfig, force: bool = False) -> tuple[Path, bool]:
    """The directory to train `cfg` in, and whether that is another budget's run to extend (`extend`).

    A config that differs from an existing run only in BUDGET_KEYS (more steps, say) would get a
    directory of its own. With ``extend=true`` (`train --extend`) it continues that run instead, in
    place; with ``extend=null`` (the default) it is refused with a line that says so; with
    ``extend=false`` it is a separate run, as every sweep point is.
    """
    run_dir = run_directory(cfg)
    extend = OmegaConf.select(cfg, "extend", default=None)
    if force or extend is False or has_attempt(run_dir):
        return run_dir, False
    siblings = budget_siblings(cfg)
    if not siblings:
        if extend:
            raise UserError(f"--extend: no run of {cfg.name} under {shown_path(run_dir.parent)} differs from this "
                            "config only in its budget (" + ", ".join(BUDGET_KEYS) + "): nothing to extend. Nothing "
                            "was trained")
        return run_dir, False
    steps = {sibling: _trained_steps(sibling) for sibling in siblings}
    if not extend:
        sibling = max(siblings, key=lambda d: steps[d] or -1)
        others = f" (and {len(siblings) - 1} more)" if len(siblings) > 1 else ""
        raise UserError(f"{shown_path(sibling)}{others} holds this experiment with another budget "
                        f"({_budget_change(sibling, cfg)}), trained to step {steps[sibling]}: add --extend to continue "
                        "it there (one metrics.csv, W&B run and results.json), or extend=false to train a separate "
                        f"run in {shown_path(run_dir)}. Nothing was trained")
    reachable = [d for d in siblings if steps[d] is not None and steps[d] < cfg.trainer.max_steps]
    if not reachable:
        sibling = max(siblings, key=lambda d: steps[d] or -1)
        raise UserError(f"--extend: {shown_path(sibling)} has trained {steps[sibling]} steps, not fewer than "
                        f"trainer.max_steps={cfg.trainer.max_steps}: give a larger trainer.max_steps. "
                        "Nothing was trained")
    return max(reachable, key=lambda d: steps[d]), True


def _trained_steps(run_dir: Path) -> int | None:
    """The step of a run's newest readable checkpoint (None: none)."""
    checkpoint = resume_checkpoint(run_dir, warn=lambda _: None)
    return None if checkpoint is None else global_step_of(checkpoint)


def _budget_change(run_dir: Path, cfg: DictConfig) -> str:
    """``trainer.max_steps 1000 -> 2000``: how `cfg`'s budget differs from the run's."""
    saved = saved_config(run_dir)
    before, after = budget_of(saved) if saved is not None else {}, budget_of(cfg)
    return ", ".join(f"{key} {before.get(key)} -> {value}" for key, value in after.items() if before.get(key) != value)


def _budget_text(budget: dict) -> str:
    return " ".join(f"{key}={value}" for key, value in budget.items() if value is not None)


def extend_run(cfg: DictConfig, run_dir: Path, echo: Callable[[str], None]) -> None:
    """Make a run (finished or not) continue with `cfg`'s budget: its results.json, if any, is kept as
    results.step-<N>.json, and extended.json records the extension (run_directory finds the run by
    its new budget through it, e.g. a requeued job's config.yaml)."""
    change = _budget_change(run_dir, cfg)
    step = _trained_steps(run_dir)
    results, kept = run_dir / "results.json", None
    if results.is_file():
        finished_at = json.loads(results.read_text()).get("global_step", step)
        kept = results.with_name(f"results.step-{finished_at}.json")
        os.replace(results, kept)
        cut_metrics(run_dir, step)  # the final evaluation's test rows: the new last step gets its own
    record = run_dir / EXTENDED
    history = json.loads(record.read_text()) if record.is_file() else []
    history.append({"from_step": step, "budget": budget_of(cfg), "change": change,
                    "time": time.strftime("%Y-%m-%d %H:%M:%S")})
    atomic_write(record, json.dumps(history, indent=2) + "\n")
    echo(f"--extend: continuing {shown_path(run_dir)} from step {step} ({change})"
         + (f"; its final evaluation at step {finished_at} is kept in {kept.name}" if kept else ""))


def plan_run(cfg: DictConfig, run_dir: Path, force: bool, echo: Callable[[str], None],
          extending: bool = False) -> RunSummary | Path | str | None:
    """What to do with the run directory: a summary (finished), a checkpoint to resume from, None
    (train from scratch here) or "start over" (the directory was moved aside: train in a new one).
    `extending`: the directory is another budget's run, to continue with `cfg`'s (`extend_run`)."""
    results = run_dir / "results.json"
    if rank_zero_only.rank != 0:  # the other processes of a distributed run follow rank 0's choice
        if force:
            return None
        if results.is_file() and not extending:  # rank 0 moves it aside when extending
            return replace(finished_summary(run_dir), metrics={})  # rank 0 alone reports it
        return resume_checkpoint(run_dir, warn=lambda _: None)
    if not has_attempt(run_dir):
        return None
    if force:
        moved = move_aside(run_dir)
        echo(f"--force: moved {shown_path(run_dir)} aside to {shown_path(moved)}; starting over")
        return "start over"
    saved = saved_config(run_dir)
    if not extending and (run_dir / EXTENDED).is_file() and saved is not None and budget_of(saved) != budget_of(cfg):
        # the run was extended in place: its name is this budget's, its config another's
        if not results.is_file() and not OmegaConf.select(cfg, "extend", default=None):
            raise UserError(f"{shown_path(run_dir)} was extended ({EXTENDED}) and now trains with another budget "
                            f"({_budget_change(run_dir, cfg)}): continue it with its own config "
                            f"({shown_path(run_dir / 'config.yaml')}), or add --extend to give it this budget. "
                            "Nothing was trained")
        extending = not results.is_file()
    if extending:
        extend_run(cfg, run_dir, echo)
    if results.is_file():  # written only once training and the final evaluation are done
        extended = (f", extended to {_budget_text(budget_of(saved))}: {EXTENDED}"
                    if (run_dir / EXTENDED).is_file() and saved is not None else "")
        echo(f"{shown_path(run_dir)} is finished (results.json{extended}): nothing to train; `relpos-lab eval "
             "CHECKPOINT` evaluates a checkpoint again, `--force` trains the run again from scratch")
        return finished_summary(run_dir)
    resume_from = resume_checkpoint(run_dir, warn=lambda line: echo(f"{PROG}: {line}"))
    where = (f"its newest checkpoint is {resume_from.name} at step {global_step_of(resume_from)}"
             if resume_from else "interrupted before its first checkpoint")
    if not cfg.resume:
        raise UserError(f"{shown_path(run_dir)} holds an interrupted attempt of this run ({where}); resume=false "
                        "leaves it alone: drop resume=false to " + ("resume it" if resume_from else "start over")
                        + f", or pass --force to start over (the old directory is moved to {run_dir.name}.old-<time>)")
    if resume_from is None:
        moved = move_aside(run_dir)
        echo(f"{shown_path(run_dir)} holds an attempt interrupted before its first checkpoint: nothing to resume; "
             f"starting over (the attempt is kept in {shown_path(moved)})")
        return "start over"
    return resume_from


def check_own_run_directory(config: Path, cfg: DictConfig) -> None:
    """A run's own config.yaml (what a requeued job trains) must still resolve to that run.

    It stops resolving there when the code's config schema gains a field or changes a default (the
    run directory hashes the whole resolved config), an override changes the experiment, or
    logging.root points elsewhere: training would then start from scratch in another directory.
    """
    home = config.resolve().parent
    if config.name != "config.yaml" or not (home / "checkpoints").is_dir():
        return
    resolved = run_directory(cfg)
    if resolved.resolve() != home:
        raise UserError(f"{shown_path(config)} belongs to the run in {shown_path(home)}, "
                        f"but now resolves to {shown_path(resolved)}: "
                        "an override changed the experiment, logging.root points elsewhere (run from the directory "
                        "the run was started in), or the config schema changed since the run started (continue it "
                        "with the code it started with: `git log` at its start time). Nothing was trained.")


def finished_summary(run_dir: Path) -> RunSummary:
    results = json.loads((run_dir / "results.json").read_text())
    checkpoint = run_dir / results["checkpoint"] if results.get("checkpoint") else None
    return RunSummary(run_dir, run_dir / "results.json", results["metrics"], sorted((run_dir / "plots").glob("*.png")),
                      checkpoint=checkpoint, checkpoint_step=results.get("checkpoint_step"),
                      checkpoint_choice=results.get("checkpoint_choice"), finished_before=True,
                      details=results.get("details") or {})
