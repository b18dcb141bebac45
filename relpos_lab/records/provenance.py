"""Where a run's numbers came from: the code's git commit and the SLURM job, for W&B's run config."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

SLURM_VARS = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_NAME", "SLURM_CLUSTER_NAME")



def provenance(run_dir: Path) -> dict[str, Any]:
    """What ran, where: the run directory, git commit of the code, and SLURM ids, for W&B's config."""
    info: dict[str, Any] = {"run_dir": str(run_dir.resolve())}
    info.update(git_state())
    slurm = {key.removeprefix("SLURM_").lower(): os.environ[key] for key in SLURM_VARS if key in os.environ}
    if slurm:
        info["slurm"] = slurm
    return {"provenance": info}



def git_state() -> dict[str, Any]:
    """Commit (and whether the tree had uncommitted changes) of the checkout holding this code.

    Looks beside the installed package first (an editable install in the researcher's clone),
    then in the working directory. Empty when neither is a git checkout with a commit.
    """
    for where in (Path(__file__).resolve().parent, Path.cwd()):
        try:
            commit = subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10
            )
            if commit.returncode != 0:
                continue
            status = subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=where, capture_output=True, text=True, timeout=10,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        return {"git_commit": commit.stdout.strip(), "git_dirty": bool(status.stdout.strip())}
    return {}

