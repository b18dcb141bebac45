"""Checkpoints: where a run keeps them, which one a run resumes from, and how a checkpoint alone
rebuilds its config and task (for `relpos-lab eval` and `translate`)."""
from __future__ import annotations

import zipfile
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from relpos_lab.api import Task, UserError, registry
from relpos_lab.api.errors import PROG, shown_path
from relpos_lab.config import config_from_container
from relpos_lab.training.module import TASK_STATE

CHECKPOINTS = "checkpoints"
LAST = "last.ckpt"


def checkpoint_config(checkpoint: Path) -> dict:
    """The experiment config saved in a checkpoint by RelposModule."""
    return _config_of(load_checkpoint(checkpoint), checkpoint)



def task_from_checkpoint(checkpoint: str | Path, overrides: list[str] = ()) -> tuple[DictConfig, Task]:
    """The config (with `overrides` on top) and the task of a checkpoint, with the task's saved
    state (say, its subword model) restored: the checkpoint alone rebuilds them."""
    checkpoint = Path(checkpoint)
    state = load_checkpoint(checkpoint)
    cfg = config_from_container(_config_of(state, checkpoint), f"config of {checkpoint}", list(overrides))
    task = registry.create_task(OmegaConf.to_object(cfg.task), seed=cfg.seed)
    task.load_state_dict(state.get(TASK_STATE) or {})
    return cfg, task



def load_checkpoint(checkpoint: Path) -> dict:
    """A checkpoint's contents (tensors memory-mapped), or a UserError saying why not.

    torch.save writes a zip archive, which can be memory-mapped; any other file is read without
    mmap (a file saved in torch's legacy format still loads), so a file that is no checkpoint at
    all is reported as such, not with torch's advice to re-save it for mmap.
    """
    if not checkpoint.is_file():
        raise UserError(f"checkpoint not found: {checkpoint}")
    try:
        return torch.load(checkpoint, map_location="cpu", weights_only=False, mmap=zipfile.is_zipfile(checkpoint))
    except Exception as err:
        first = str(err).strip().split("\n")[0].split(". ")[0].rstrip(".")  # torch's messages run on
        reason = f"torch.load: {type(err).__name__}" + (f": {first}" if first else "")
        raise UserError(f"{shown_path(checkpoint)} is not a checkpoint torch can read ({reason}); give a .ckpt file "
                        f"written by `{PROG} train`, e.g. runs/<name>/<run>/checkpoints/last.ckpt") from None



def _config_of(state: dict, checkpoint: Path) -> dict:
    try:
        return state["hyper_parameters"]["config"]
    except (KeyError, TypeError):
        raise UserError(f"{checkpoint}: not a relpos-lab checkpoint (no config in its hyperparameters)") from None



def resume_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint to continue from: last.ckpt, or a SLURM requeue's hpc_ckpt_*.ckpt."""
    found = [p for p in [run_dir / CHECKPOINTS / LAST, *run_dir.glob("hpc_ckpt_*.ckpt")] if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None



def global_step_of(checkpoint: Path) -> int | None:
    if not checkpoint.is_file():
        return None
    return load_checkpoint(checkpoint).get("global_step")

