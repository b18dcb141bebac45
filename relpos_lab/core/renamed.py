"""Names renamed in 0.2.0 that keep working until 0.3.0 (CHANGELOG.md): a module's `__getattr__`
(PEP 562) answers an old name with the new object and a DeprecationWarning naming the new one; a
renamed attribute of a class is a property that does the same (`renamed_attribute`), a renamed
method of a class meant to be subclassed answers to both names, in the class and in subclasses
that still override the old one (`renamed_methods`), and a renamed submodule's old state-dict keys
load into the new one (`renamed_state_dict_keys`).

The renamed module-level names are written down once, in RENAMED_NAMES; a module answers its own
and a package those of its modules whose new name it exports."""
from __future__ import annotations

import functools
import sys
import warnings

RENAMED_NAMES: dict[str, dict[str, str]] = {
    "relpos_lab.core.attention.masks": {"relative_positions": "relative_labels", "reach": "max_offset"},
    "relpos_lab.core.positions.absolute": {
        "SinusoidalPositions": "SinusoidalEmbedding", "LearnedPositions": "LearnedEmbedding", "NoPositions": "NoPE",
        "NoPositionsConfig": "NoPEConfig"},
    "relpos_lab.core.positions.base": {"scheme_of": "position_scheme_of"},
    "relpos_lab.core.positions.digits": {
        "AbacusPositions": "AbacusEmbedding", "CouplingPositions": "PositionCouplingEmbedding",
        "CouplingEmbedding": "PositionCouplingEmbedding"},
    "relpos_lab.core.positions.polar": {"PolarPositions": "PopePositions"},
    "relpos_lab.core.positions.rotary": {"rotate_half": "apply_rotation"},
    "relpos_lab.training.inference": {"load_for_inference": "load_model"},
}
"""Every renamed module-level name that still works, by the module that defines the new one:
{module: {old: new}}. The package relpos_lab.core.positions answers its schemes' old names too."""


def warn_renamed(owner: str, old: str, new: str) -> None:
    """The DeprecationWarning of `owner`.`old`, now `new`, attributed to the caller of the function that warns."""
    warnings.warn(f"{owner}.{old} is deprecated: it is {owner}.{new} now (CHANGELOG.md)", DeprecationWarning,
                  stacklevel=3)


def renamed(module: str, namespace: dict):
    """The `__getattr__` of `module`, whose globals are `namespace`: its old names (RENAMED_NAMES),
    and for a package its modules' old names whose new name it exports."""
    def __getattr__(name: str):
        new = renamed_in(module, namespace).get(name)
        if new is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warn_renamed(module, name, new)
        return namespace[new]

    return __getattr__


def renamed_in(module: str, namespace: dict) -> dict[str, str]:
    """{old: new} of the names `module` answers (see `renamed`)."""
    found = dict(RENAMED_NAMES.get(module, {}))
    for owner, names in RENAMED_NAMES.items():
        if owner.startswith(module + "."):
            found.update({old: new for old, new in names.items() if new in namespace and old not in found})
    return found


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


def renamed_methods(cls: type, owner: str, old_to_new: dict[str, str]) -> None:
    """Keep the renamed methods of class `owner` (dotted; a base class plugins subclass) working in
    `cls`, `owner` itself or a subclass: call it once on the base and from its `__init_subclass__`.

    Afterwards every class defines both names of a method or neither, so that both resolve to the
    same class of the MRO and `super().old(...)` in an old override reaches its base's method:
    - a class that defines the new name gets the old one, which warns and calls this class's method;
    - a class that still overrides only the old name (a plugin written before the rename) has it
      under the new name too, which is what the framework calls, and is warned once, at the
      method's definition.
    """
    for old, new in old_to_new.items():
        own = vars(cls)
        if new in own and old not in own:
            setattr(cls, old, _renamed_method(owner, old, new, own[new]))
        elif old in own and new not in own:
            setattr(cls, new, own[old])
            _warn_override(cls, owner, old, new, own[old])


def _renamed_method(owner: str, old: str, new: str, method):
    @functools.wraps(method)
    def alias(self, *args, **kwargs):
        warn_renamed(owner, old, new)
        return method(self, *args, **kwargs)

    alias.__name__, alias.__doc__ = old, f"Deprecated: {owner}.{new}."
    alias.__qualname__ = f"{alias.__qualname__.rpartition('.')[0]}.{old}".lstrip(".")
    return alias


def _warn_override(cls: type, owner: str, old: str, new: str, method) -> None:
    """The DeprecationWarning of a subclass that overrides `old`, attributed to its definition."""
    code = getattr(method, "__code__", None)
    module = sys.modules.get(cls.__module__)
    namespace = vars(module) if module is not None else None
    filename = code.co_filename if code is not None else getattr(module, "__file__", None) or cls.__module__
    message = (f"{owner}.{old} is deprecated: it is {owner}.{new} now (CHANGELOG.md); "
               f"{cls.__module__}.{cls.__qualname__} overrides {old}, and is called as {new}: rename it")
    warnings.warn_explicit(message, DeprecationWarning, filename, code.co_firstlineno if code is not None else 1,
                           module=cls.__module__,
                           registry=namespace.setdefault("__warningregistry__", {}) if namespace is not None else None,
                           module_globals=namespace)


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
