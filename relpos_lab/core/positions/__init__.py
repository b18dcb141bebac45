"""Position schemes: one class each, with a config dataclass of only its own fields.

A scheme contributes where it says (base.py): to the token embeddings (absolute), to q and k (a
rotation), to the attention call (Shaw's tables, a score bias), or to the logits from the tokens
themselves (a content bias: CoPE, FoX, DAPE); abacus and position coupling read the token ids to
place digits in their numbers (digits.py). The built-in schemes are registered under the
``relpos_lab.positions`` entry-point group exactly as third-party ones are
(relpos_lab.api.registry finds them; `relpos-lab positions` lists them), and the Transformer
builds whatever a config names through `position_scheme_of(cfg)`, its `PositionScheme` (the config's
`scheme` is the scheme's name).
"""
from relpos_lab.core.positions.absolute import (
    Learned,
    LearnedConfig,
    LearnedEmbedding,
    NoPE,
    NoPEConfig,
    Sinusoidal,
    SinusoidalConfig,
    SinusoidalEmbedding,
)
from relpos_lab.core.positions.base import (
    Drawing,
    KeyState,
    PositionConfig,
    PositionScheme,
    RelativePositions,
    position_scheme_of,
)
from relpos_lab.core.positions.bias import (
    Alibi,
    AlibiConfig,
    AlibiPositions,
    Sandwich,
    SandwichConfig,
    SandwichPositions,
    T5Bias,
    T5BiasConfig,
    T5BiasPositions,
    alibi_slopes,
)
from relpos_lab.core.positions.cope import Cope, CopeConfig, CopePositions
from relpos_lab.core.positions.dape import Dape, DapeConfig, DapePositions
from relpos_lab.core.positions.digits import (
    Abacus,
    AbacusConfig,
    AbacusEmbedding,
    PositionCoupling,
    PositionCouplingConfig,
    PositionCouplingEmbedding,
)
from relpos_lab.core.positions.fire import Fire, FireConfig, FirePositions
from relpos_lab.core.positions.fox import Fox, FoxConfig, FoxPositions
from relpos_lab.core.positions.polar import Pope, PopeConfig, PopePositions
from relpos_lab.core.positions.rotary import Rope, RopeConfig, RotaryPositions, Xpos, XposConfig, XposPositions
from relpos_lab.core.positions.shaw import Shaw, ShawConfig, ShawPositions
from relpos_lab.core.positions.transformer_xl import TransformerXL, TransformerXLConfig, TransformerXLPositions

BUILTIN = {"none": NoPE, "sinusoidal": Sinusoidal, "learned": Learned, "shaw": Shaw, "rope": Rope,
           "alibi": Alibi, "t5_bias": T5Bias, "transformer_xl": TransformerXL,
           "fire": Fire, "sandwich": Sandwich, "xpos": Xpos, "pope": Pope, "cope": Cope, "fox": Fox,
           "dape": Dape, "abacus": Abacus, "position_coupling": PositionCoupling}
"""The built-in schemes by name, as pyproject.toml registers them (a test checks the two agree)."""


def builtin_config(scheme: str, **fields) -> PositionConfig:
    """The config of a built-in scheme, e.g. builtin_config("shaw", max_distance=4)."""
    if scheme not in BUILTIN:
        raise ValueError(f"model.positions.scheme={scheme!r} is not built in; choose one of {', '.join(BUILTIN)}")
    return BUILTIN[scheme].config_class(**fields)


__all__ = [
    "BUILTIN",
    "Abacus",
    "AbacusConfig",
    "AbacusEmbedding",
    "Alibi",
    "AlibiConfig",
    "AlibiPositions",
    "Cope",
    "CopeConfig",
    "CopePositions",
    "Dape",
    "DapeConfig",
    "DapePositions",
    "Drawing",
    "Fire",
    "FireConfig",
    "FirePositions",
    "Fox",
    "FoxConfig",
    "FoxPositions",
    "KeyState",
    "Learned",
    "LearnedConfig",
    "LearnedEmbedding",
    "NoPE",
    "NoPEConfig",
    "Pope",
    "PopeConfig",
    "PopePositions",
    "PositionConfig",
    "PositionCoupling",
    "PositionCouplingConfig",
    "PositionCouplingEmbedding",
    "PositionScheme",
    "RelativePositions",
    "Rope",
    "RopeConfig",
    "RotaryPositions",
    "Sandwich",
    "SandwichConfig",
    "SandwichPositions",
    "Shaw",
    "ShawConfig",
    "ShawPositions",
    "Sinusoidal",
    "SinusoidalConfig",
    "SinusoidalEmbedding",
    "T5Bias",
    "T5BiasConfig",
    "T5BiasPositions",
    "TransformerXL",
    "TransformerXLConfig",
    "TransformerXLPositions",
    "Xpos",
    "XposConfig",
    "XposPositions",
    "alibi_slopes",
    "builtin_config",
    "position_scheme_of",
]
