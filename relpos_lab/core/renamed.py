"""What a rename leaves behind for a release, and old checkpoints' keys, which stay.

An attribute renamed in 0.3.0 keeps working until 0.4.0 (CHANGELOG.md): a property that warns and
answers with the new one (`renamed_attribute`; DecoderCache.input_pos). The 0.2.0 renames kept
working until 0.3.0 and are gone, as CHANGELOG.md's policy says. A checkpoint is data, not API: a
state dict saved before a submodule was renamed keeps loading (`renamed_state_dict_keys`), with no
warning and no end date.
"""
from __future__ import annotations

import functools
import warnings


def warn_renamed(owner: str, old: str, new: str) -> None:
    """The DeprecationWarning of `owner`.`old`, now `new`, attributed to the caller of the function that warns."""
    warnings.warn(f"{owner}.{old} is deprecated: it is {owner}.{new} now (CHANGELOG.md)", DeprecationWarning,
                  stacklevel=3)


def renamed_attribute(owner: str, old: str, new: str, *, settable: bool = False) -> property:
    """A property `old` of class `owner` (dotted) that warns and returns attribute `new`; `settable`:
    assigning to it also warns and sets `new` (for a plain value a script may set, not a submodule)."""
    def get(self):
        warn_renamed(owner, old, new)
        return getattr(self, new)

    def put(self, value):
        warn_renamed(owner, old, new)
        setattr(self, new, value)

    return property(get, put if settable else None, doc=f"Deprecated: {owner}.{new}.")


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
