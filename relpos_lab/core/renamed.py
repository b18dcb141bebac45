"""Names renamed in 0.2.0 that keep working until 0.3.0 (CHANGELOG.md): a module's `__getattr__`
(PEP 562) answers an old name with the new object and a DeprecationWarning naming the new one."""
from __future__ import annotations

import warnings


def renamed(module: str, old_to_new: dict[str, str], namespace: dict):
    """The `__getattr__` of `module`, whose globals are `namespace`."""
    def __getattr__(name: str):
        if name not in old_to_new:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(f"{module}.{name} is deprecated: it is {module}.{old_to_new[name]} now (CHANGELOG.md)",
                      DeprecationWarning, stacklevel=2)
        return namespace[old_to_new[name]]

    return __getattr__
