"""Deprecated since 0.2.0, removed in 0.3.0: the pre-0.2 path of the position schemes (see CHANGELOG.md).

Before 0.2 one `PositionConfig` held every scheme's fields; now each scheme has its own config
class (`relpos_lab.core.positions.builtin_config(scheme, **fields)` makes a built-in one) and is a
plugin (`relpos_lab.api.PositionScheme`). `PositionConfig(scheme=..., **fields)` here makes the
named built-in scheme's config, dropping the fields that scheme does not have, as the old class
ignored them; `build_absolute` and `build_relative` ask the scheme for its modules.
"""
import dataclasses
import warnings

from torch import nn

from relpos_lab.core.positions import (
    BUILTIN,
    AlibiPositions,
    LearnedEmbedding as LearnedPositions,
    PositionConfig as _PositionConfig,
    RelativePositions,
    RotaryPositions,
    ShawPositions,
    SinusoidalEmbedding as SinusoidalPositions,
    T5BiasPositions,
    alibi_slopes,
    builtin_config,
    position_scheme_of,
)

SCHEMES = tuple(BUILTIN)


def PositionConfig(scheme: str = "shaw", **fields) -> _PositionConfig:  # noqa: N802 (the old class's name)
    """The config of built-in `scheme`, from the old all-schemes fields."""
    own = {f.name for f in dataclasses.fields(builtin_config(scheme))}
    return builtin_config(scheme, **{name: value for name, value in fields.items() if name in own})


def build_absolute(cfg: _PositionConfig, d_model: int) -> nn.Module | None:
    return position_scheme_of(cfg).embedding(d_model)


def build_relative(cfg: _PositionConfig, head_dim: int, n_heads: int, causal: bool) -> RelativePositions:
    return position_scheme_of(cfg).attention(head_dim, n_heads, causal) or RelativePositions()


__all__ = [
    "SCHEMES", "AlibiPositions", "LearnedPositions", "PositionConfig", "RelativePositions", "RotaryPositions",
    "ShawPositions", "SinusoidalPositions", "T5BiasPositions", "alibi_slopes", "build_absolute", "build_relative",
]

warnings.warn("relpos_lab.positions is deprecated; import PositionConfig, PositionScheme and RelativePositions "
              "from relpos_lab.api, the built-in schemes from relpos_lab.core.positions (see CHANGELOG.md)",
              DeprecationWarning, stacklevel=2)
