"""File helpers for anything that writes beside a running job (tasks' caches, the run record)."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write a file so that readers (and a crash) see the old content or the new, never half."""
    atomic_write_with(path, lambda file: file.write(data.encode() if isinstance(data, str) else data))


def atomic_write_with(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """`write(file)` into a temporary file beside `path`, flushed to disk, then renamed over it.

    A failed write (a full disk: ENOSPC, often only at the flush or the fsync) leaves `path` as it
    was, and its OSError names `path` (a write to a file object names no file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~umask())  # mkstemp's file is 0600; the file open() would make is what colleagues read
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        os.unlink(tmp)
        # torch.save's zip writer turns a failed write into a RuntimeError ("unexpected pos") as it
        # closes: the OSError beneath it is what happened.
        cause = next((e for e in _chain(err) if isinstance(e, OSError) and e.errno is not None), None)
        if cause is not None and (cause is not err or err.filename is None):
            raise OSError(cause.errno, cause.strerror, str(path)) from err
        raise


def append_text(path: Path, text: str) -> None:
    """Append `text` to `path` whole or not at all: a failed write (a full disk) cuts the file back
    to where it ended, and its OSError names `path`."""
    end = path.stat().st_size if path.exists() else None
    try:
        with open(path, "a", newline="") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
    except BaseException as err:
        if end is None:
            path.unlink(missing_ok=True)
        else:
            os.truncate(path, end)
        if isinstance(err, OSError) and err.errno is not None and err.filename is None:
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise


def umask() -> int:
    """The process's umask (the mode bits new files do not get)."""
    current = os.umask(0o022)
    os.umask(current)
    return current


def _chain(err: BaseException):
    """`err`, then the exceptions it was raised from or while handling."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__
