"""One training process per run directory.

Two processes training into one directory (a sweep point submitted twice, a job still queued when
the same command is run by hand) would interleave checkpoints, metrics.csv and the W&B run. The
lock is an flock on ``<run dir>/.lock``, held by the launching process (rank 0) for the whole
run: the kernel releases it when that process ends however it ends, so a killed or requeued job
never leaves a stale lock behind. The file names its holder, for the error message.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from lightning.pytorch.utilities.rank_zero import rank_zero_only

from relpos_lab.api.errors import UserError

LOCK = ".lock"


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold `run_dir`'s lock (rank 0 only; other ranks belong to the holder's run)."""
    if rank_zero_only.rank != 0:
        yield
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / LOCK, "a+") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            file.seek(0)
            holder = file.read().strip() or "another process"
            raise UserError(f"{run_dir} is being trained by {holder}: wait for it to end or stop it; two "
                            "processes in one run directory would overwrite each other's checkpoints") from None
        except OSError as err:  # a filesystem without flock (some network mounts)
            warnings.warn(f"cannot lock {run_dir / LOCK} ({err}); not guarding against a second trainer", stacklevel=3)
            yield
            return
        file.seek(0)
        file.truncate()
        job = os.environ.get("SLURM_JOB_ID")
        file.write(f"pid {os.getpid()} on {socket.gethostname()}" + (f" (SLURM job {job})" if job else "")
                   + f" since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        file.flush()
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)
