"""The one exception type for mistakes in what the user gave us, and how its messages are phrased.

The CLI prints a `UserError` as a single line and exits with status 2, and a `ContractError` (a
plugin broke its contract, core/errors.py) as a single line with status 1, wherever Lightning
raised them; anything else is a bug and keeps its traceback (`-v` shows it for these two as well).
Raising this type is how a module says "the input is wrong, not the code".
Messages name paths as the user sees them (`shown_path`), suggest the spelling they likely meant
(`did_you_mean`) and the command to run (`PROG`).
"""
from __future__ import annotations

import difflib
from pathlib import Path

from relpos_lab.core.errors import ContractError

PROG = "relpos-lab"


class UserError(Exception):
    """Bad input (config, task name, file path): reported as one line, exit status 2."""


class ConfigError(UserError):
    """A config file or override that does not fit the schema; the message names key and source."""


def own_error(err: BaseException) -> UserError | ContractError | None:
    """The project's own error behind `err`: `err` itself, or the one it was raised from or while
    handling (Lightning's teardown, a logger's finalize failing after the real error)."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, UserError | ContractError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def did_you_mean(word: str, candidates: list[str] | tuple[str, ...]) -> str | None:
    """The valid spelling the user most likely meant: a completion of `word`, else a near match."""
    completions = [c for c in candidates if c.startswith(word)]
    if len(completions) == 1:
        return completions[0]
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.5)
    return close[0] if close else None


def shown_path(path: Path | str) -> str:
    """A path relative to the working directory when it lies below it, else absolute."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.resolve())
