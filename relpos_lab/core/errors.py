"""ContractError: a plugin (a position scheme, a task) broke the contract the core calls it by.

The checks (positions/contract.py for a scheme's hooks, api/contract.py for a Task's verbs) word
it in one line naming the plugin, the hook and what was wrong. Its own class lets `relpos-lab` print
that line, not a traceback, wherever the check fires: often deep inside Lightning's first training
step. It is a TypeError and a ValueError both, the types these checks raised before it existed.
"""


class ContractError(TypeError, ValueError):
    """A plugin returned what its contract forbids; the message names the plugin, hook and fix."""
