"""The one exception type for mistakes in what the user gave us, and how its messages are phrased.

The CLI prints a `UserError` as a single line and exits with status 2; anything else is a bug and
keeps its traceback. Raising this type is how a module says "the input is wrong, not the code".
Messages name paths as the user sees them (`shown_path`), suggest the spelling they likely meant
(`did_you_mean`) and the command to run (`PROG`).
"""
from __future__ import annotations

import difflib
from pathlib import Path

PROG = "relpos-lab"


class UserError(Exception):
    """Bad input (config, task name, file path): reported as one line, exit status 2."""


class ConfigError(UserError):
    """A config file or override that does not fit the schema; the message names key and source."""


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
