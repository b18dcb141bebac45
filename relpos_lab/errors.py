"""The one exception type for mistakes in what the user gave us.

The CLI prints a `UserError` as a single line and exits with status 2; anything else is a bug and
keeps its traceback. Raising this type is how a module says "the input is wrong, not the code".
"""
from __future__ import annotations


class UserError(Exception):
    """Bad input (config, task name, file path): reported as one line, exit status 2."""


class ConfigError(UserError):
    """A config file or override that does not fit the schema; the message names key and source."""
