"""Names renamed in 0.2.0 that keep working until 0.3.0 (CHANGELOG.md): a module's `__getattr__`
(PEP 562) answers an old name with the new object and a DeprecationWarning naming the new one; a
renamed attribute of a class is a property that does the same (`renamed_attribute`), and a renamed
submodule's old state-dict keys load into the new one (`renamed_state_dict_keys`)."""
from __future__ import annotations

import functools
import warnings


def _warn(owner: str, old: str, new: str) -> None:
    warnings.warn(f"{owner}.{old} is deprecated: it is {owner}.{new} now (CHANGELOG.md)", DeprecationWarning,
                  stacklevel=3)


def renamed(module: str, old_to_new: dict[str, str], namespace: dict):
    """The `__getattr__` of `module`, whose globals are `namespace`."""
    def __getattr__(name: str):
        if name not in old_to_new:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        _warn(module, name, old_to_new[name])
        return namespace[old_to_new[name]]

    return __getattr__


def renamed_attribute(owner: str, old: str, new: str) -> property:
    """A read-only property `old` of class `owner` (dotted) that warns and returns attribute `new`."""
    def get(self):
        _warn(owner, old, new)
        return getattr(self, new)

    return property(get, doc=f"Deprecated: {owner}.{new}.")


def renamed_state_dict_keys(old: str, new: str):
    """A load_state_dict pre-hook (`nn.Module.register_load_state_dict_pre_hook`) that loads a state
    dict saved before the module's submodule `old` was renamed `new`: its keys `<prefix>old.…`
    become `<prefix>new.…` (unless the new key is there too, which strict loading then reports).
    A partial of a module-level function, so that a model holding it still pickles."""
    return functools.partial(_load_renamed, old, new)


def _load_renamed(old: str, new: str, module, state_dict, prefix, local_metadata, strict, missing_keys,
                  unexpected_keys, error_msgs) -> None:
    before, after = f"{prefix}{old}", f"{prefix}{new}"
    for key in [k for k in state_dict if k.startswith(before + ".")]:
        renamed_key = after + key[len(before):]
        if renamed_key not in state_dict:
            state_dict[renamed_key] = state_dict.pop(key)
    metadata = getattr(state_dict, "_metadata", None)  # the submodules' versions, by dotted prefix: the new
    # names get the old ones' (the caller's dict gains those entries; its keys stay as they were)
    if metadata is not None:
        for key in [k for k in metadata if k == before or k.startswith(before + ".")]:
            metadata.setdefault(after + key[len(before):], metadata[key])
